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
// Notation: T tokens (packed), N sequences, H query/key heads, HV = m * H
// value heads (m >= 1, fla's grouped value attention; value head i uses key
// head i / m), K key dim, V value dim (each in [1, 256]). Per value head, the
// state S is K x V, stored K-major ([k][v]); a batch of states is
// [N, HV, K, V] fp32. For each token t of a sequence (design §2.5):
//   S <- diag(exp(g_t)) S
//   S <- S + k_t (beta_t * (v_t - S^T k_t))^T
//   o_t = S^T (scale * q_t)
// with g_t <= 0 the log decay and beta_t a scalar per value head (or, in
// fused_recurrent_kda, a [V] vector). The decay has one of two widths (the
// arguments' scalar_gate):
// - KDA (Kimi Delta Attention): g_t in R^K, one decay per key dimension;
// - Gated DeltaNet (GDN): g_t in R, one decay per value head (diag(exp(g_t))
//   = exp(g_t) I), g stored [T, HV] and never broadcast over K.
// All arithmetic is fp32; q/k/v
// are fp32, bf16 or fp16 (one dtype), g and beta any of the three, and the
// output o has the dtype of q (rounded once).
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
  // g holds the raw gate; the kernel applies, with x = g_raw + dt_bias[h*K + d]
  // (a scalar gate: dt_bias[h]),
  //   g = -exp(A_log[h]) * softplus(x)  (softplus(x) = x for x > 20), or, with use_lower_bound,
  //   g = lower_bound * sigmoid(exp(A_log[h]) * x)  (A_log null: lower_bound * sigmoid(x)).
  bool use_gate_in_kernel = false;
  const float* A_log = nullptr;    // [HV]; required with use_gate_in_kernel unless use_lower_bound
  const float* dt_bias = nullptr;  // [HV*K] ([HV] with a scalar gate), optional with use_gate_in_kernel
  bool use_lower_bound = false;
  float lower_bound = 0.0F;  // < 0
  // beta holds logits: the kernel uses beta_scale * sigmoid(beta), beta_scale
  // 2 with allow_neg_eigval (eigenvalues of the transition in (-1, 1]), else 1.
  bool use_beta_sigmoid_in_kernel = false;
  float beta_scale = 1.0F;
  // false: no delta correction, S += beta k v^T instead of S += k (beta (v - S^T k))^T: the plain gated linear
  // recurrence of Mamba2's SSD (with k = B, q = C, v = x, beta = dt, g = dt A, scale 1, a scalar gate).
  bool delta_correction = true;
  // Mamba2's skip (mamba_ssm's D), only without the delta correction: D [HV] fp32, o_t += D[h] v_t in fp32
  // before o's one rounding; null: none.
  const float* D = nullptr;
};

// Elements between consecutive tokens of q, k and v, whose rows [H, K] (q, k)
// and [HV, V] (v) are contiguous; 0 (the default) is the contiguous row: H * K
// for q and k, HV * V for v. Otherwise >= the row: q, k and v may be slices
// of one fused projection [T, s] (s = 2 * H * K + HV * V), read in place.
struct QkvTokenStrides {
  int64_t q = 0, k = 0, v = 0;
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
  MutBuf o;                      // [T, HV, V], dtype of q
  float* final_state = nullptr;  // [N, HV, K, V]; written when output_final_state
  // Inputs.
  ConstBuf q, k;                         // [T, H, K]
  ConstBuf v;                            // [T, HV, V]
  ConstBuf g;                            // [T, HV, K] ([T, HV] with scalar_gate) log decay (or raw gate, see options)
  ConstBuf beta;                         // [T, HV]
  bool scalar_gate = false;              // g is one decay per value head (GDN), see above
  QkvTokenStrides token_strides;         // of q, k, v
  const int64_t* cu_seqlens = nullptr;   // [N + 1], 0 = cu[0] <= ... <= cu[N] = T
  const float* initial_state = nullptr;  // [N, HV, K, V] or null (zeros); may alias final_state
  // Pool form (see above): state [S, HV, K, V], read and written in place
  // (the final state only when output_final_state).
  float* state = nullptr;
  const int32_t* state_indices = nullptr;      // [N] or null (contiguous form)
  int64_t num_states = 0;                      // S
  const uint8_t* has_initial_state = nullptr;  // [N] or null (every sequence reads its initial state)
  bool output_final_state = true;
  // Optional mid-sequence state snapshots, emitted during the one pass over the
  // tokens (prefix caching): sequence n writes its state after
  // snapshot_offsets[j] of its tokens, j in [snapshot_cu[n], snapshot_cu[n+1]),
  // to snapshot_states[j] (an [HV, K, V] destination each, [HV, V, K] with
  // state_v_first, distinct from every other state), in snapshot_dtype:
  // fp32, or the fp32 state rounded once (bf16, fp16). Offsets count from
  // the sequence start (its initial state included), strictly increase, and
  // are multiples of kSnapshotGrain in (0, length] or the length itself.
  // Padding sequences have none. Null snapshot_cu: no snapshots.
  const int64_t* snapshot_cu = nullptr;       // [N + 1], snapshot_cu[0] = 0
  const int64_t* snapshot_offsets = nullptr;  // [snapshot_cu[N]]
  void* const* snapshot_states = nullptr;     // [snapshot_cu[N]] destinations
  DType snapshot_dtype = DType::kF32;         // F32, BF16 or F16
  // Optional intermediate states (fla's return_intermediate_states): the state
  // at the start of every chunk of chunk_size tokens. Sequence n has
  // ceil(len_n / chunk_size) chunks; its chunk i, the state before its token
  // i * chunk_size (chunk 0: its initial state, or zeros), goes to row
  // first_n + i, first_n = sum over m < n of ceil(len_m / chunk_size), rounded
  // once to the buffer's dtype. A padding sequence's rows are zero. Excludes
  // the snapshots above (the kernels emit these through them).
  MutBuf intermediate_states;  // [NT, HV, K, V] (all the sequences' chunks), any float dtype; null data: none
  int chunk_size = 64;         // 32 or 64; read only with intermediate_states
  int64_t T = 0;
  int64_t N = 0;
  int H = 0, HV = 0, K = 0, V = 0;
  bool state_v_first = false;  // every state above is [.., HV, V, K]
  KdaOptions options;
};

// Snapshot offsets of chunk_kda are multiples of kSnapshotGrain (fla's smaller
// chunk size, and the optimized kernel's token block), or a sequence's length.
// Serving takes its snapshots at multiples of kSnapshotAlign (the default chunk
// size).
inline constexpr int64_t kSnapshotGrain = 32;
inline constexpr int64_t kSnapshotAlign = 64;

// Arguments of fused_recurrent_kda: the recurrence token by token over N
// packed sequences (decode: one token each; speculative verification: a few).
//
// States come in one of two forms:
// - contiguous (state_indices null): sequence n starts from initial_state[n]
//   (null: zeros) and, when final_state is set, writes its state after its
//   last token to final_state[n] (which may be initial_state's buffer);
// - pool (state_indices set): states live in state [S, HV, K, V], read and
//   written in place. state_indices is [N, C] (C = index_cols; 1-D indices
//   are C = 1). Sequence n starts from slot idx[n][a - 1], a =
//   num_accepted_tokens[n] (absent: 1); an index < 0 there marks a padding
//   sequence: zero outputs, no state read or written. With C = 1 its state
//   after its last token goes to slot idx[n][0]; with C > 1 its state after
//   token t goes to slot idx[n][t] (negative: not written), t < C. With
//   token_states set instead (fla's inplace_final_state=False) the pool is
//   only read, and the state after every token t of sequence n goes to
//   token_states[cu_seqlens[n] + t] ([T, HV, K, V]).
// Different sequences touch disjoint slots.
struct RecurrentKdaArgs {
  // Outputs.
  MutBuf o;  // [T, HV, V], dtype of q
  // Inputs.
  ConstBuf q, k;                  // [T, H, K]
  ConstBuf v;                     // [T, HV, V]
  ConstBuf g;                     // [T, HV, K] ([T, HV] with scalar_gate)
  ConstBuf beta;                  // [T, HV], or [T, HV, V] with beta_per_value
  bool scalar_gate = false;       // g is one decay per value head (GDN)
  QkvTokenStrides token_strides;  // of q, k, v
  bool beta_per_value = false;
  const int64_t* cu_seqlens = nullptr;  // [N + 1], 0 = cu[0] <= ... <= cu[N] = T
  // Contiguous form.
  const float* initial_state = nullptr;  // [N, HV, K, V] or null (zeros)
  float* final_state = nullptr;          // [N, HV, K, V] or null (not written)
  // Pool form.
  float* state = nullptr;                  // [S, HV, K, V]
  const int32_t* state_indices = nullptr;  // [N, index_cols]
  int64_t index_cols = 1;
  int64_t num_states = 0;                        // S
  const int32_t* num_accepted_tokens = nullptr;  // [N] in [1, index_cols], or null
  bool write_slots = true;                       // the states go to the pool's slots
  float* token_states = nullptr;                 // [T, HV, K, V] or null, without write_slots
  int64_t T = 0;
  int64_t N = 0;
  int H = 0, HV = 0, K = 0, V = 0;
  bool state_v_first = false;  // every state above is [.., HV, V, K]
  KdaOptions options;
};

// The token tensors and head sizes both argument kinds hold, set at once (by the bound front-end calls and by
// the backend's trusted ones).
template <class Args>
void SetTokensAndHeads(Args& a, MutBuf o, ConstBuf q, ConstBuf k, ConstBuf v, ConstBuf g, ConstBuf beta, int H, int HV,
                       int K, int V) {
  a.o = o;
  a.q = q;
  a.k = k;
  a.v = v;
  a.g = g;
  a.beta = beta;
  a.H = H;
  a.HV = HV;
  a.K = K;
  a.V = V;
}

// Validates shapes and options; throws kda::Error naming the problem. The
// kernels call these first and touch no output when they throw.
void ValidateChunkKda(const ChunkKdaArgs& a);
void ValidateRecurrentKda(const RecurrentKdaArgs& a);

// ------------------------------------------------------------------ calls

// The entry a call is made through, which names it in error messages: KDA's
// (chunk_kda, fused_recurrent_kda) or Gated DeltaNet's
// (chunk_gated_delta_rule, whose g must be [B, T, HV];
// fused_recurrent_gated_delta_rule).
enum class DeltaRuleEntry : uint8_t { kKda, kGatedDeltaRule };

// What both calls share: the tokens, the output, the sequences and the
// options, in fla's names. B batch rows of T tokens; with cu_seqlens B = 1 and
// the T tokens are N packed sequences, without it the rows are N = B
// sequences of T tokens.
struct KdaCallCommon {
  DeltaRuleEntry entry = DeltaRuleEntry::kKda;
  // [B, T, HV, V] in fla's dtype: q's for chunk_kda, v's for fused_recurrent_kda (absent in a shape check)
  MutTensorView o;
  // q, k [B, T, H, K] and v [B, T, HV, V]: float32, bfloat16 or float16, each its own (as fla reads them;
  // the kernels take one: see NeedsFloat32Copies). C-contiguous, or
  // token-strided (read in place, see QkvTokenStrides): strides [T * s, s, K, 1] ([T * s, s, V, 1] for v)
  // with s >= the row, any stride on a unit dimension. The other tensors are C-contiguous.
  TensorView q, k, v;
  // [B, T, HV, K] (KDA: a decay per key dimension) or [B, T, HV] (GDN: a scalar gate per value head):
  // log decay, or the raw gate with use_gate_in_kernel.
  TensorView g;
  TensorView beta;             // [B, T, HV] (fused_recurrent_kda also [B, T, HV, V])
  std::optional<float> scale;  // none: K^-0.5; else finite and > 0
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  bool use_beta_sigmoid_in_kernel = false;
  bool allow_neg_eigval = false;     // requires use_beta_sigmoid_in_kernel
  std::optional<float> lower_bound;  // < 0; with use_gate_in_kernel, fla's sigmoid gate
  // States (every state argument of the call) as [.., HV, V, K] instead of [.., HV, K, V].
  bool state_v_first = false;
  // kda's own (fla has none): false runs the plain gated linear recurrence, S += beta k v^T (KdaOptions).
  bool delta_correction = true;
  TensorView cu_seqlens;  // [N + 1] i64 or i32, optional
  TensorView A_log;       // [HV] f32: required with use_gate_in_kernel unless lower_bound is set (else ignored, as fla)
  TensorView dt_bias;     // [HV * K] or [HV, K] ([HV] with a scalar gate) f32, optional with use_gate_in_kernel
  TensorView D;           // [HV] f32, optional, only with delta_correction false: o += D[h] v (KdaOptions::D)
};

// chunk_kda as fla calls it (fla.ops.kda.chunk_kda), plus kda's pool form.
struct ChunkKdaCall : KdaCallCommon {
  MutTensorView final_state;  // [N, HV, K, V] f32; required with output_final_state (contiguous form)
  // [N, HV, K, V] f32, optional (zeros); may be final_state's buffer. Gated DeltaNet's entry also takes
  // float16 and bfloat16 (as fla's chunk_gated_delta_rule; its chunk_kda asserts float32).
  TensorView initial_state;
  bool output_final_state = false;
  bool safe_gate = false;  // validated as fla does (lower_bound in [-5, 0) with use_gate_in_kernel)
  int chunk_size = 64;     // 32 or 64, as fla
  // kda's pool form: with state_indices [N] i32, sequence n reads and writes
  // state[state_indices[n]] of the pool [S, HV, K, V] f32 in place (negative:
  // padding), whatever output_final_state says; initial_state and final_state
  // stay absent.
  MutTensorView state;
  TensorView state_indices;
  TensorView has_initial_state;  // [N] u8, optional: 0 starts sequence n from zeros
  // fla's return_intermediate_states: intermediate_states (fla's h) receives
  // the state at the start of every chunk of chunk_size tokens,
  // [B, NT, HV, K, V] ([B, NT, HV, V, K] with state_v_first) in k's dtype:
  // without cu_seqlens NT = ceil(T / chunk_size) per row; with cu_seqlens
  // B = 1 and NT is the number of chunks of all the sequences (see
  // ChunkKdaArgs::intermediate_states; KdaCallShapes::num_chunks). Also in
  // the pool form (chunk 0: the slot's state; padding sequences: zeros).
  bool return_intermediate_states = false;
  MutTensorView intermediate_states;
  // Mid-sequence snapshots (serving's prefix cache; see ChunkKdaArgs), fp32
  // destinations (listed as the arguments take them); they exclude
  // return_intermediate_states.
  const int64_t* snapshot_cu = nullptr;
  const int64_t* snapshot_offsets = nullptr;
  void* const* snapshot_states = nullptr;
};

// fused_recurrent_kda_fwd as vLLM calls it (fla's pool and speculative
// entry): the recurrence token by token (see RecurrentKdaArgs).
// - inplace_final_state (the default): the final states go back into
//   initial_state (required): with ssm_state_indices it is the pool
//   [S, HV, K, V] (1-D indices [N], or 2-D [N, C] with a slot per token),
//   without it [N, HV, K, V] (state n).
// - otherwise, with output_final_state, final_state receives them:
//   [N, HV, K, V] (state after each sequence's last token) without indices,
//   [T_total, HV, K, V] (state after every token, row bos + t) with them.
// num_accepted_tokens [N] (2-D indices only): sequence n starts from slot
// idx[n][num_accepted_tokens[n] - 1].
struct RecurrentKdaCall : KdaCallCommon {
  // The pool, or [N, HV, K, V]; optional without inplace_final_state. float32, or as fla takes it float16
  // or bfloat16: the states computed in fp32 and written back rounded to nearest even.
  MutTensorView initial_state;
  MutTensorView final_state;  // f32, see above
  bool output_final_state = false;
  bool inplace_final_state = true;
  TensorView ssm_state_indices;    // [N] or [N, C] i32; < 0 padding
  TensorView num_accepted_tokens;  // [N] i32 or i64, optional
};

// The sizes a call implies: o is [B, T, HV, V], a final state [N, HV, K, V]
// (fused_recurrent_kda with indices and without inplace_final_state:
// [B * T, HV, K, V]).
struct KdaCallShapes {
  int64_t B = 0, T = 0, N = 0;
  int H = 0, HV = 0, K = 0, V = 0;
  bool scalar_gate = false;       // g is [B, T, HV] (GDN)
  int64_t num_states = 0;         // S of the pool form (0 otherwise)
  QkvTokenStrides token_strides;  // of q, k, v (0: contiguous)
  // chunk_kda: NT, the chunks of chunk_size tokens (intermediate_states is
  // [B, NT, ...]): ceil(T / chunk_size) without cu_seqlens, else the sum over
  // the sequences of ceil(length / chunk_size); -1 in a shape check whose
  // cu_seqlens has no data (the caller supplies the count).
  int64_t num_chunks = 0;
};

// Checks the call's shapes, dtypes, layouts and options without reading any
// tensor's data, which may be null (a traced call), except the small index
// tensors (cu_seqlens, the state indices, num_accepted_tokens,
// has_initial_state): those are checked by value, as a bind checks them, when
// their data is given (2-D ssm_state_indices and num_accepted_tokens with
// cu_seqlens' data too, or without cu_seqlens). Outputs may be absent, and so
// may fused_recurrent_kda's pool and indices (a caller learning N). Throws
// kda::Error naming the argument (kda::DTypeError for element types).
KdaCallShapes CheckChunkKdaShapes(const ChunkKdaCall& call);
KdaCallShapes CheckRecurrentKdaShapes(const RecurrentKdaCall& call);

// Whether a call holds q, k and v of different dtypes or a float16 / bfloat16 initial state: the kernels
// read one dtype and fp32 states, so chunk_kda and fused_recurrent_kda (kda_dispatch.h) run it on fp32
// copies (exact), which is what fla computes (each tensor read in its own dtype, fp32 math); a bind
// (BindChunkKda, BindRecurrentKda) refuses it.
bool NeedsFloat32Copies(const ChunkKdaCall& call);
bool NeedsFloat32Copies(const RecurrentKdaCall& call);
// What a bind checks of such a call's views before it is copied: everything CheckChunkKdaShapes checks, every
// output present and data behind every element (the values are the bind's of the fp32 call).
void CheckCallToCopy(const ChunkKdaCall& call);
void CheckCallToCopy(const RecurrentKdaCall& call);

// Whether the kernels read a [B, T, heads, dim] token view (q, k, v) in place:
// C-contiguous, or token-strided (see KdaCallCommon::q). A view of another rank
// answers true: a call refuses it by its shape.
bool ReadsTokensInPlace(const TensorView& v);

// Everything CheckChunkKdaShapes checks, every output present, and the
// values (as ValidateChunkKda); returns the kernel arguments, pointing into the
// call's tensors. Allocates nothing, except that int32 or absent cu_seqlens
// are widened, and chunk_kda's snapshot destinations listed (as void*), into
// per-thread buffers, which the arguments point to until the thread's next
// bind.
ChunkKdaArgs BindChunkKda(const ChunkKdaCall& call);
RecurrentKdaArgs BindRecurrentKda(const RecurrentKdaCall& call);

}  // namespace kda
