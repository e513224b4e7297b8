// Where the KDA kernels read token t's rows of q, k and v (QkvTokenStrides),
// and where fused_recurrent_kda's sequences read and write their states (see
// RecurrentKdaArgs), shared by the reference and the per-ISA optimized code.
// Always inlined (like kda::BF16RoundedBits): per-ISA sources may call them,
// and no out-of-line copy compiled for one instruction set can be shared with
// code compiled for another (kernels/isa/target.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kda/kernels/kda_args.h"

#define KDA_STATES_INLINE [[gnu::always_inline]] inline

namespace kda::internal {

// The key head of value head hv (grouped value heads: HV / H value heads per key head).
KDA_STATES_INLINE int KeyHeadOf(int hv, int heads, int value_heads) { return hv / (value_heads / heads); }

// The element offsets of token t's row of key head kh in q and k ([T, H, K]
// rows, token strides as given) and of value head h in v ([T, HV, V] rows);
// Args is ChunkKdaArgs or RecurrentKdaArgs.
template <class Args>
KDA_STATES_INLINE size_t QOffset(const Args& a, int64_t t, int kh) {
  const int64_t row = a.token_strides.q > 0 ? a.token_strides.q : static_cast<int64_t>(a.H) * a.K;
  return static_cast<size_t>(t * row + static_cast<int64_t>(kh) * a.K);
}
template <class Args>
KDA_STATES_INLINE size_t KOffset(const Args& a, int64_t t, int kh) {
  const int64_t row = a.token_strides.k > 0 ? a.token_strides.k : static_cast<int64_t>(a.H) * a.K;
  return static_cast<size_t>(t * row + static_cast<int64_t>(kh) * a.K);
}
template <class Args>
KDA_STATES_INLINE size_t VOffset(const Args& a, int64_t t, int h) {
  const int64_t row = a.token_strides.v > 0 ? a.token_strides.v : static_cast<int64_t>(a.HV) * a.V;
  return static_cast<size_t>(t * row + static_cast<int64_t>(h) * a.V);
}

// The states of fused_recurrent_kda's sequence n (see RecurrentKdaArgs).
struct RecurrentStates {
  bool padding = false;            // zero outputs, no state read or written
  const float* initial = nullptr;  // [HV, K, V] (null: zeros)
};
KDA_STATES_INLINE size_t SequenceStates(const RecurrentKdaArgs& a) {
  return static_cast<size_t>(a.HV) * static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
}
KDA_STATES_INLINE RecurrentStates RecurrentStatesOf(const RecurrentKdaArgs& a, int64_t n) {
  RecurrentStates r;
  if (a.state_indices == nullptr) {
    r.initial = a.initial_state != nullptr ? a.initial_state + static_cast<size_t>(n) * SequenceStates(a) : nullptr;
    return r;
  }
  const int64_t col = a.num_accepted_tokens != nullptr ? a.num_accepted_tokens[n] - 1 : 0;
  const int32_t slot = a.state_indices[n * a.index_cols + col];
  r.padding = slot < 0;
  if (!r.padding) r.initial = a.state + static_cast<size_t>(slot) * SequenceStates(a);
  return r;
}
// Where the state after token t (of the sequence's len) of a non-padding
// sequence n goes ([HV, K, V]; null: nowhere).
KDA_STATES_INLINE float* TokenStateDestination(const RecurrentKdaArgs& a, int64_t n, int64_t t, int64_t len) {
  const size_t seq = SequenceStates(a);
  if (a.state_indices == nullptr) {
    return a.final_state != nullptr && t == len - 1 ? a.final_state + static_cast<size_t>(n) * seq : nullptr;
  }
  if (!a.write_slots) {
    return a.token_states != nullptr ? a.token_states + static_cast<size_t>(a.cu_seqlens[n] + t) * seq : nullptr;
  }
  if (a.index_cols == 1) return t == len - 1 ? a.state + static_cast<size_t>(a.state_indices[n]) * seq : nullptr;
  const int32_t slot = a.state_indices[n * a.index_cols + t];
  return slot >= 0 ? a.state + static_cast<size_t>(slot) * seq : nullptr;
}
// The final state an empty sequence n writes: contiguous form only (as fla).
KDA_STATES_INLINE float* EmptySequenceFinalState(const RecurrentKdaArgs& a, int64_t n) {
  if (a.state_indices != nullptr || a.final_state == nullptr) return nullptr;
  return a.final_state + static_cast<size_t>(n) * SequenceStates(a);
}

}  // namespace kda::internal
