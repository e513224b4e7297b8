// The optimized KDA core kernels (kernels/kda/kda_optimized.cc: validation,
// tasks, threads; the compute code in chunk_kda_simd.cc and
// fused_recurrent_kda_simd.cc, compiled once per instruction set).
#pragma once

#include "kda/kernels/kda_args.h"

namespace kda {

// Optimized kernels with the contract of the references (same arguments,
// validation, aliasing and padding rules; results within the fp32 tolerance of
// them, and independent of the thread count). Vectorised for the instruction
// set that ActiveKernelIsa() names (kernel_isa.h); multithreaded over sequences
// and heads, and over value columns within a head when there are few
// (sequence, head) pairs. Prefill uses the recurrent form with scaled state
// rows, decode two passes over each state.
void chunk_kda_optimized(const ChunkKdaArgs& a);
void fused_recurrent_kda_optimized(const RecurrentKdaArgs& a);

}  // namespace kda
