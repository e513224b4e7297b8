// Private interface between the optimized KDA kernels' host code
// (optimized.cc: validation, workspaces, task split, threads) and their
// per-ISA compute code (optimized_{generic,avx2,avx512}.cc, one templated
// source, optimized_impl.h, compiled once per instruction set).
//
// The per-ISA files see only these plain structs: no std:: containers or
// other inline library code crosses into code compiled with -mavx512f, so the
// linker can never pick an AVX-512 copy of a shared inline function for a CPU
// without it.
#pragma once

#include <cstdint>

#include "kda/kernels/kda.h"

namespace kda::internal {

// Prefill tokens are prepared in blocks of this many rows (per-token decay
// vectors, see optimized_impl.h), then swept once per value-column block.
inline constexpr int kOptTokenBlock = 32;

// The prepared vectors of one token block. Shapes: khat, ktil, qhat, mfac
// [kOptTokenBlock][K]; vrow [kOptTokenBlock][task width]; beta, flag [kOptTokenBlock].
struct PrepBuffers {
  float* khat = nullptr;
  float* ktil = nullptr;
  float* qhat = nullptr;
  float* mfac = nullptr;
  float* vrow = nullptr;
  float* beta = nullptr;
  uint8_t* flag = nullptr;
};

// Cache lines of one token's input rows (q, k, g, v at K, V <= 256 in fp32, unaligned, and beta).
inline constexpr int kMaxLinesPerToken = 4 * 17 + 1;

// Scratch of one worker for chunk tasks, sized for K, V (allocated by the host,
// 64-byte aligned): state [K * V] (column blocks, each [K][width]), c [K], two
// prepared blocks (the one being swept and the next one), and the addresses of
// the next block's input lines to prefetch [kOptTokenBlock * kMaxLinesPerToken].
struct ChunkScratch {
  float* state = nullptr;
  float* c = nullptr;
  PrepBuffers prep[2];
  const void** lines = nullptr;
};

// Heads of one sequence that a chunk task processes in lockstep, block by
// block: their rows of a token share pages, so their input streams share TLB
// entries (one head alone walks a new page per row).
inline constexpr int kOptHeadGroup = 4;

// One head of a chunk task: sequence n, head h, value columns [v_begin, v_end)
// (a multiple of the ISA's column block, except at V), its scratch. initial
// and final are sequence n's states [H, K, V], resolved by the host from the
// contiguous or the pool form (null: start from zeros / do not write).
struct ChunkTask {
  const ChunkKdaArgs* args = nullptr;
  int64_t n = 0;
  int h = 0;
  const float* initial = nullptr;
  float* final = nullptr;
  int v_begin = 0;
  int v_end = 0;
  float scale = 1.0F;
  ChunkScratch scratch;
};

// One chunk task: heads [h, h + heads) (heads <= kOptHeadGroup) of sequence n
// over value columns [v_begin, v_end), one scratch per head. The sequence is
// not empty (nor padding); initial and final as in ChunkTask.
struct ChunkGroupTask {
  const ChunkKdaArgs* args = nullptr;
  int64_t n = 0;
  int h = 0;
  const float* initial = nullptr;
  float* final = nullptr;
  int heads = 1;
  int v_begin = 0;
  int v_end = 0;
  float scale = 1.0F;
  ChunkScratch scratch[kOptHeadGroup];
};

// One decode task: entry n (padding or not), head h.
struct RecurrentTask {
  const RecurrentKdaArgs* args = nullptr;
  int64_t n = 0;
  int h = 0;
  float scale = 1.0F;
};

// The compute code of one instruction set.
struct IsaKernels {
  void (*chunk_task)(const ChunkGroupTask& task) = nullptr;
  void (*recurrent_task)(const RecurrentTask& task) = nullptr;
  int column_block = 16;  // value columns per register block of the chunk sweep
};

// Defined in the per-ISA files; the AVX2 and AVX-512 ones return kernels with
// null function pointers when the build is not for x86-64.
IsaKernels GenericKernels();
IsaKernels Avx2Kernels();
IsaKernels Avx512Kernels();

// The kernels for `isa` (not kAuto), which the CPU must support.
IsaKernels KernelsFor(KernelIsa isa);

// The optimized kernels without validation (callers validate first), running
// the given ISA variant.
void ChunkKdaOptimizedUnchecked(const ChunkKdaArgs& a, KernelIsa isa);
void FusedRecurrentKdaOptimizedUnchecked(const RecurrentKdaArgs& a, KernelIsa isa);

}  // namespace kda::internal
