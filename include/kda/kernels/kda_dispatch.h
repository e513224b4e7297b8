// The KDA kernel dispatcher (kernels/kda/kda_dispatch.cc): which
// implementation a call runs (the reference or the optimized kernels), and the
// dispatching entry points chunk_kda / fused_recurrent_kda that the layers call.
#pragma once

#include <cstdint>
#include <string>

#include "kda/kernels/kda_args.h"

namespace kda {

enum class KernelImpl : uint8_t { kAuto, kReference, kOptimized };

// "auto" | "reference" | "optimized"; throws kda::Error on anything else.
KernelImpl ParseKernelImpl(const std::string& name);
const char* KernelImplName(KernelImpl impl);

// The process-wide default used when a call passes kAuto: set through
// SetDefaultKernelImpl, else the KDA_KERNEL environment variable, else auto.
void SetDefaultKernelImpl(KernelImpl impl);
KernelImpl DefaultKernelImpl();

// The implementation a call with `requested` actually runs: auto resolves to
// the optimized kernels (they cover every valid shape, with a generic build for
// CPUs without AVX2). Throws kda::Error if the requested one is unavailable
// (for optimized: if KDA_ISA is bad, see ActiveKernelIsa).
KernelImpl ResolveKernelImpl(KernelImpl requested);

// What a call with `requested` runs, for log lines and benchmark fields:
// "reference" or "optimized/<isa>" (e.g. "optimized/avx512"). A static string;
// throws like ResolveKernelImpl / ActiveKernelIsa.
const char* ActiveKernelDescription(KernelImpl requested = KernelImpl::kAuto);

// Dispatching entry points: bind the call (kda_args.h; kda::Error naming the
// argument, nothing written) and run the implementation `impl` resolves to.
void chunk_kda(const ChunkKdaCall& call, KernelImpl impl = KernelImpl::kAuto);
void fused_recurrent_kda(const RecurrentKdaCall& call, KernelImpl impl = KernelImpl::kAuto);

// The entry of the layers' backend, validated once, trusted after: kernel
// arguments it builds from a geometry checked at model and pool construction
// and step metadata it checked itself, run as they are by `impl` (resolved,
// ResolveKernelImpl). Arguments that break ValidateChunkKda's rules are
// undefined behaviour; builds with KDA_VALIDATE_TRUSTED_CALLS (the sanitizer
// build) check them anyway.
void RunTrusted(const ChunkKdaArgs& a, KernelImpl impl);
void RunTrusted(const RecurrentKdaArgs& a, KernelImpl impl);

}  // namespace kda
