// The arguments of the two KDA core kernels, chunked prefill (`chunk_kda`) and
// one-token decode (`fused_recurrent_kda`), and their validation
// (kernels/kda/kda_args.cc). Every implementation takes these: the references
// (chunk_kda_reference.h, fused_recurrent_kda_reference.h), the optimized
// kernels (kda_optimized.h) and the dispatcher (kda_dispatch.h).
//
// Notation: T tokens (packed), N sequences, H heads, K key dim, V value dim.
// Per head, the state S is K x V, stored K-major ([k][v]); a batch of states
// is [N, H, K, V] fp32. For each token t of a sequence (design §2.5):
//   S <- diag(exp(g_t)) S
//   S <- S + beta_t k_t (v_t - S^T k_t)^T
//   o_t = S^T (scale * q_t)
// with g_t <= 0 the per-key-dim log decay. All arithmetic is fp32; q/k/v/g/
// beta may be fp32 or bf16, the output o has the dtype of q.
#pragma once

#include <cstdint>

#include "kda/base/dtype.h"

namespace kda {

// Options shared by both kernels (the fla names).
struct KdaOptions {
  float scale = 0.0F;  // multiplies q; <= 0 means K^-0.5
  // L2-normalise q and k over K inside the kernel: x / sqrt(sum x^2 + 1e-6).
  bool use_qk_l2norm_in_kernel = false;
  // g holds the raw gate; the kernel applies
  //   g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h*K + d])  (softplus(x) = x for x > 20)
  bool use_gate_in_kernel = false;
  const float* A_log = nullptr;    // [H], required with use_gate_in_kernel
  const float* dt_bias = nullptr;  // [H*K], optional with use_gate_in_kernel
};

// Arguments of chunk_kda (prefill over a packed variable-length batch).
//
// States come in one of two forms:
// - contiguous: initial_state / final_state [N, H, K, V], one per sequence;
// - pool (state_indices set): sequence n reads its initial state from and
//   writes its final state to state[state_indices[n]] of a [S, H, K, V]
//   buffer, in place (as fused_recurrent_kda; initial_state and final_state
//   stay null). An index < 0 marks a padding sequence: its outputs are zero
//   and no state is read or written. Indices must be distinct.
// In both forms has_initial_state[n] == 0 makes sequence n start from zeros
// without reading its initial state (a fresh request's slot need not be
// cleared first).
struct ChunkKdaArgs {
  // Outputs.
  MutBuf o;                      // [T, H, V], dtype of q
  float* final_state = nullptr;  // [N, H, K, V]; written when output_final_state
  // Inputs.
  ConstBuf q, k;                         // [T, H, K]
  ConstBuf v;                            // [T, H, V]
  ConstBuf g;                            // [T, H, K] log decay (or raw gate, see options)
  ConstBuf beta;                         // [T, H]
  const int64_t* cu_seqlens = nullptr;   // [N + 1], 0 = cu[0] <= ... <= cu[N] = T
  const float* initial_state = nullptr;  // [N, H, K, V] or null (zeros); may alias final_state
  // Pool form (see above): state [S, H, K, V], read and written in place
  // (the final state only when output_final_state).
  float* state = nullptr;
  const int32_t* state_indices = nullptr;      // [N] or null (contiguous form)
  int64_t num_states = 0;                      // S
  const uint8_t* has_initial_state = nullptr;  // [N] or null (every sequence reads its initial state)
  bool output_final_state = true;
  // Optional mid-sequence state snapshots, emitted during the one pass over the
  // tokens (prefix caching): sequence n writes its state after
  // snapshot_offsets[j] of its tokens, j in [snapshot_cu[n], snapshot_cu[n+1]),
  // to snapshot_states[j] (an [H, K, V] fp32 destination each, distinct from
  // every other state). Offsets count from the sequence start (its initial
  // state included), strictly increase, and are multiples of kSnapshotAlign
  // in (0, length] or the length itself. Padding sequences have none. Null
  // snapshot_cu: no snapshots.
  const int64_t* snapshot_cu = nullptr;       // [N + 1], snapshot_cu[0] = 0
  const int64_t* snapshot_offsets = nullptr;  // [snapshot_cu[N]]
  float* const* snapshot_states = nullptr;    // [snapshot_cu[N]] destinations
  int64_t T = 0;
  int64_t N = 0;
  int H = 0, K = 0, V = 0;
  KdaOptions options;
};

// Snapshot offsets of chunk_kda are multiples of this (the chunk size), or a
// sequence's length.
inline constexpr int64_t kSnapshotAlign = 64;

// Arguments of fused_recurrent_kda (decode: one token for each of N sequences,
// the state updated in place in a state buffer through an index array).
struct RecurrentKdaArgs {
  // Outputs.
  MutBuf o;  // [N, H, V], dtype of q
  // State buffer [S, H, K, V] fp32, read and written in place: sequence n uses
  // state[state_indices[n]]. An index < 0 marks a padding entry: its output is
  // zero and no state is read or written.
  float* state = nullptr;
  const int32_t* state_indices = nullptr;  // [N]
  int64_t num_states = 0;                  // S, the number of states in the buffer
  // Inputs.
  ConstBuf q, k;  // [N, H, K]
  ConstBuf v;     // [N, H, V]
  ConstBuf g;     // [N, H, K]
  ConstBuf beta;  // [N, H]
  int64_t N = 0;
  int H = 0, K = 0, V = 0;
  KdaOptions options;
};

// Validates shapes and options; throws kda::Error naming the problem. The
// kernels call these first and touch no output when they throw.
void ValidateChunkKda(const ChunkKdaArgs& a);
void ValidateRecurrentKda(const RecurrentKdaArgs& a);

}  // namespace kda
