// The arguments of the two KDA core kernels, chunked prefill (`chunk_kda`) and
// one-token decode (`fused_recurrent_kda`), in two forms (kernels/kda/kda_args.cc):
// - the call (ChunkKdaCall, RecurrentKdaCall): the tensors as views plus the
//   options, in fla's names. This is what callers build: the backend, the
//   numpy/torch bindings, the XLA FFI handlers, the tests and the benchmarks.
//   BindChunkKda / BindRecurrentKda check it, once, and bind it to
// - the kernel arguments (ChunkKdaArgs, RecurrentKdaArgs): pointers and
//   sizes, what the implementations take: the references
//   (chunk_kda_reference.h, fused_recurrent_kda_reference.h) and the optimized
//   kernels (kda_optimized.h). The dispatcher (kda_dispatch.h) takes calls.
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
#include <optional>

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

// ------------------------------------------------------------------ calls

// chunk_kda as fla calls it (fla.ops.kda.chunk_kda), plus kda's pool form.
// B batch rows of T tokens; with cu_seqlens B = 1 and the T tokens are N
// packed sequences, without it the rows are N = B sequences of T tokens.
struct ChunkKdaCall {
  // Outputs (absent in a shape check).
  MutTensorView o;            // [B, T, H, V], q's dtype
  MutTensorView final_state;  // [N, H, K, V] f32; required with output_final_state (contiguous form)
  // Inputs, in fla's order.
  TensorView q, k;             // [B, T, H, K], f32 or bf16 (one dtype with v)
  TensorView v;                // [B, T, H, V]
  TensorView g;                // [B, T, H, K] f32 or bf16: log decay, or the raw gate with use_gate_in_kernel
  TensorView beta;             // [B, T, H] f32 or bf16
  std::optional<float> scale;  // none: K^-0.5; else finite and > 0
  TensorView initial_state;    // [N, H, K, V] f32, optional (zeros); may be final_state's buffer
  bool output_final_state = false;
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  TensorView cu_seqlens;  // [N + 1] i64 or i32, optional
  TensorView A_log;       // [H] f32, required with use_gate_in_kernel (else ignored, as fla)
  TensorView dt_bias;     // [H * K] or [H, K] f32, optional with use_gate_in_kernel
  // kda's pool form: with state_indices [N] i32, sequence n reads and writes
  // state[state_indices[n]] of the pool [S, H, K, V] f32 in place (negative:
  // padding), whatever output_final_state says; initial_state and final_state
  // stay absent.
  MutTensorView state;
  TensorView state_indices;
  TensorView has_initial_state;  // [N] u8, optional: 0 starts sequence n from zeros
  // Mid-sequence snapshots (serving's prefix cache; see ChunkKdaArgs), passed through.
  const int64_t* snapshot_cu = nullptr;
  const int64_t* snapshot_offsets = nullptr;
  float* const* snapshot_states = nullptr;
};

// fused_recurrent_kda as vLLM calls it: one token for each of N sequences,
// each updating its state in the pool in place.
struct RecurrentKdaCall {
  MutTensorView o;  // [B, T, H, V], q's dtype (absent in a shape check)
  // q, k, g [B, T, H, K], v [B, T, H, V], beta [B, T, H]: N = B * T tokens,
  // either [N, 1, ...], or [1, N, ...] with cu_seqlens = [0, 1, ..., N].
  TensorView q, k, v, g, beta;
  std::optional<float> scale;
  MutTensorView initial_state;   // the pool [S, H, K, V] f32, updated in place
  TensorView cu_seqlens;         // [N + 1] i64 or i32, optional
  TensorView ssm_state_indices;  // [N] i32: sequence n uses initial_state[ssm_state_indices[n]]; < 0 padding
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  TensorView A_log, dt_bias;  // as ChunkKdaCall
};

// The sizes a call implies: o is [B, T, H, V], a final state [N, H, K, V].
struct KdaCallShapes {
  int64_t B = 0, T = 0, N = 0;
  int H = 0, K = 0, V = 0;
  int64_t num_states = 0;  // S of the pool form (0 otherwise)
};

// Checks the call's shapes, dtypes, layouts and options without reading any
// tensor's data, which may be null (a traced call), except the small index
// tensors (cu_seqlens, the state indices, has_initial_state): those are
// checked by value when their data is given. Outputs may be absent, and so
// may fused_recurrent_kda's pool and indices (a caller learning N). Throws
// kda::Error naming the argument (kda::DTypeError for element types).
KdaCallShapes CheckChunkKdaShapes(const ChunkKdaCall& call);
KdaCallShapes CheckRecurrentKdaShapes(const RecurrentKdaCall& call);

// Everything CheckChunkKdaShapes checks, every output present, and the
// values (as ValidateChunkKda); returns the kernel arguments, pointing into the
// call's tensors. Allocates nothing, except that int32 or absent cu_seqlens
// are widened into a per-thread buffer, which the arguments point to until the
// thread's next bind.
ChunkKdaArgs BindChunkKda(const ChunkKdaCall& call);
RecurrentKdaArgs BindRecurrentKda(const RecurrentKdaCall& call);

}  // namespace kda
