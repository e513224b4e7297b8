// Private interface between the optimized KDA kernels' host code
// (kernels/kda/kda_optimized.cc: validation, workspaces, task split, threads) and their
// per-ISA compute code (kernels/kda/chunk_kda_simd.cc and fused_recurrent_kda_simd.cc,
// compiled once per instruction set, reached through the dispatch table of
// kernels/isa/dispatch.h). The per-ISA code sees only these plain structs.
#pragma once

#include <cstdint>

#include "kda/kernels/kda_args.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/isa/constants.h"

namespace kda::internal {

// The head dims the optimized kernels work in, zero-padded: K to whole
// registers and row groups of the prefill passes, V to whole registers
// (padded keys and values are zeros, so the padded state rows and columns stay
// zero and add nothing).
[[gnu::always_inline]] constexpr int RoundUpTo(int x, int m) { return (x + m - 1) / m * m; }
[[gnu::always_inline]] constexpr int PaddedKeyDim(int k_dim, int lanes) {
  return RoundUpTo(k_dim, lanes > kc::kPassRowGroup ? lanes : kc::kPassRowGroup);
}
[[gnu::always_inline]] constexpr int PaddedValueDim(int v_dim, int lanes) { return RoundUpTo(v_dim, lanes); }
// The state rows the prefill sweep runs over: K rounded up to whole row groups only. The sweep broadcasts
// one row's scalars at a time, so it needs no lane padding of K; rows past this bound (and past K) stay zero,
// with zero khat and qhat (K = 100 with 16 lanes: 104 rows of the 112 stored).
[[gnu::always_inline]] constexpr int SweepRows(int k_dim) { return RoundUpTo(k_dim, kc::kPassRowGroup); }

// The prepared vectors of one token block (kernels/kda/chunk_kda_simd.cc, PrepareToken). Shapes: khat, qhat,
// kpre, kq, mfac [kc::kTokenBlock][K]; vrow [kc::kTokenBlock][task width]; beta, gamma, mat [kc::kTokenBlock]
// (mat: bit j set when rows [j, j + 1) * kc::kPassRowGroup hold one materialised at the token).
struct PrepBuffers {
  float* khat = nullptr;
  float* qhat = nullptr;
  float* kpre = nullptr;
  float* kq = nullptr;
  float* mfac = nullptr;
  float* vrow = nullptr;
  float* beta = nullptr;
  float* gamma = nullptr;
  uint32_t* mat = nullptr;
};

// Scratch of one worker for chunk tasks, sized for K, V (allocated by the host,
// 64-byte aligned): state [K * V] (column blocks, each [K][width]), c [K], c_end [K], proj [2 * V], two
// prepared blocks (the one being swept and the next one), and the addresses of
// the next block's lines to prefetch (inputs; outputs stored plainly) [kc::kTokenBlock * kc::kMaxLinesPerToken].
struct ChunkScratch {
  float* state = nullptr;
  float* c = nullptr;
  float* c_end = nullptr;  // [K], the row scales at a snapshot's block end
  float* proj = nullptr;   // [2][V]: the projections a block's last pass leaves for the next block
  PrepBuffers prep[2];
  const void** lines = nullptr;
};

// The sequence a chunk task works on, as it and each of its heads name it:
// sequence n from head h. initial and final are sequence n's states [H, K, V],
// resolved by the host from the contiguous or the pool form (null: start from
// zeros / do not write).
struct ChunkTaskSequence {
  const ChunkKdaArgs* args = nullptr;
  int64_t n = 0;
  int h = 0;
  const float* initial = nullptr;
  float* final = nullptr;
};

// One head of a chunk task: head h of the sequence, value columns
// [v_begin, v_end) (a multiple of the ISA's column block, except at V), its
// scratch.
struct ChunkTask : ChunkTaskSequence {
  int v_begin = 0;
  int v_end = 0;
  float scale = 1.0F;
  ChunkScratch scratch;
};

// One chunk task: heads [h, h + heads) (heads <= kc::kHeadGroup) of the
// sequence over value columns [v_begin, v_end), one scratch per head. The
// sequence is not empty (nor padding).
struct ChunkGroupTask : ChunkTaskSequence {
  int heads = 1;
  int v_begin = 0;
  int v_end = 0;
  float scale = 1.0F;
  ChunkScratch scratch[kc::kHeadGroup];
};

// Scratch of one worker for the chunked SSD tasks (kernels/kda/chunk_ssd_simd.cc), sized for K' and V' (the
// padded head dims) by the host, 64-byte aligned.
struct SsdScratch {
  // A span's rows of its key head: q and k [kc::kSsdSpan][K'] (fp32, the in-kernel norm applied), and q_i . k_c
  // within each chunk [kc::kSsdSpan][kc::kSsdChunk].
  float* q{};
  float* k{};
  float* qk{};
  // One head's chunk: its decay-weighted products m [kc::kSsdChunk][kc::kSsdChunk], its v rows and weighted v rows
  // [kc::kSsdChunk][V'].
  float* m{};
  float* v{};
  float* vw{};
  // Its per-token vectors [kc::kSsdChunk]: gate (then e^g), beta, the running decays e^{s(i, c)}, the readout and
  // the update factors.
  float* g{};
  float* beta{};
  float* decay{};
  float* readout{};
  float* update{};
  // The working states of the task's heads [kc::kSsdMaxHeads][K' * V'] (the layout of ChunkScratch::state), and
  // the row scales [K'] the state stores read (all ones).
  float* states{};
  float* ones{};
};

// One chunked SSD task: value heads [h, h + heads) of the sequence, all of one key head (heads <=
// kc::kSsdMaxHeads), every value column.
struct SsdTask : ChunkTaskSequence {
  int heads = 1;
  float scale = 1.0F;
  SsdScratch scratch;
};

// One fused_recurrent_kda task: sequence n (padding or not), value head h;
// scratch [K * V] floats of its worker (a working state where no destination
// holds it: state_v_first, or tokens whose state is not written).
struct RecurrentTask {
  const RecurrentKdaArgs* args = nullptr;
  int64_t n = 0;
  int h = 0;
  float scale = 1.0F;
  float* scratch = nullptr;
};

// The optimized kernels without validation (callers validate first), running
// the given ISA variant.
void ChunkKdaOptimizedUnchecked(const ChunkKdaArgs& a, KernelIsa isa);
void FusedRecurrentKdaOptimizedUnchecked(const RecurrentKdaArgs& a, KernelIsa isa);

}  // namespace kda::internal
