// The instruction-set variant of every optimized CPU kernel (KDA core, short
// conv, element-wise, int8 GEMM): the CPU's best, or the one SetKernelIsa or
// the KDA_ISA environment variable names (kernels/isa/kernel_isa.cc).
#pragma once

#include <cstdint>
#include <string>

namespace kda {

// Instruction-set variants of every optimized CPU kernel: one source set
// (the *_simd.cc files) compiled per ISA level,
// chosen at run time from the CPU's features, one switch for all of them.
// kAvx512Shape is a test variant, never chosen by itself: the AVX-512
// variant's code (16 lanes, its register blocks) built for AVX2, so that
// CPUs without AVX-512 test the code paths only that variant takes.
enum class KernelIsa : uint8_t { kAuto, kGeneric, kAvx2, kAvx512, kAvx512Shape };

// "auto" | "generic" | "avx2" | "avx512" | "avx512_shape"; throws kda::Error on anything else.
KernelIsa ParseKernelIsa(const std::string& name);
const char* KernelIsaName(KernelIsa isa);

// Whether this CPU (and build) can run the variant; kAuto and kGeneric always can.
bool CpuSupportsKernelIsa(KernelIsa isa);
// The best variant this CPU supports (never kAuto).
KernelIsa BestKernelIsa();

// Forces the variant the optimized kernels use (kAuto: back to the KDA_ISA
// environment variable, else the best). Throws kda::Error if the CPU lacks it.
void SetKernelIsa(KernelIsa isa);
// The variant the optimized kernels use now (never kAuto): SetKernelIsa's,
// else KDA_ISA (auto|generic|avx2|avx512|avx512_shape), else BestKernelIsa(). Throws
// kda::Error if KDA_ISA is unknown or names a variant the CPU lacks.
KernelIsa ActiveKernelIsa();

}  // namespace kda
