// Private helpers shared by the KDA kernels: loading one token's q/k/v/g/beta
// row into fp32 (with the optional in-kernel L2 norm, scale and gate), and the
// unchecked kernel entry points the dispatcher calls after validation.
//
// Only input preparation lives here; the core math of the chunked and the
// recurrent kernels stays separate so that each can check the other.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_gate.h"
#include "kernels/isa/constants.h"

namespace kda::internal {

using kc::kL2NormEps;   // eps of the in-kernel L2 norm: x / sqrt(sum x^2 + eps)
using kc::kMaxHeadDim;  // largest head dim the kernels accept (validated)

// The scale applied to q: options.scale, or K^-0.5 when it is <= 0.
inline float EffectiveScale(const KdaOptions& opt, int k_dim) {
  return opt.scale > 0.0F ? opt.scale : 1.0F / std::sqrt(static_cast<float>(k_dim));
}

// Copies row `row` (a token-head pair, t * H + h) of a [rows, len] buffer into out[0, len).
inline void LoadRow(const ConstBuf& buf, int64_t row, int len, float* out) {
  const size_t base = static_cast<size_t>(row) * static_cast<size_t>(len);
  for (int d = 0; d < len; ++d) out[d] = LoadAsFloat(buf.data, buf.dtype, base + static_cast<size_t>(d));
}

inline void L2NormalizeInPlace(float* x, int len) {
  float sum_sq = 0.0F;
  for (int d = 0; d < len; ++d) sum_sq += x[d] * x[d];
  const float norm = std::sqrt(sum_sq + kL2NormEps);
  for (int d = 0; d < len; ++d) x[d] /= norm;
}

// q row of token-head `row`: optionally L2-normalised, then multiplied by scale.
inline void LoadQ(const ConstBuf& q, int64_t row, int k_dim, const KdaOptions& opt, float scale, float* out) {
  LoadRow(q, row, k_dim, out);
  if (opt.use_qk_l2norm_in_kernel) L2NormalizeInPlace(out, k_dim);
  for (int d = 0; d < k_dim; ++d) out[d] *= scale;
}

// k row of token-head `row`: optionally L2-normalised.
inline void LoadK(const ConstBuf& k, int64_t row, int k_dim, const KdaOptions& opt, float* out) {
  LoadRow(k, row, k_dim, out);
  if (opt.use_qk_l2norm_in_kernel) L2NormalizeInPlace(out, k_dim);
}

// Log-decay row of token-head `row` (head h): as given, or activated in the
// kernel from the raw gate with A_log[h] and dt_bias[h * K + d].
inline void LoadGate(const ConstBuf& g, int64_t row, int h, int k_dim, const KdaOptions& opt, float* out) {
  LoadRow(g, row, k_dim, out);
  if (!opt.use_gate_in_kernel) return;
  const float a_log = opt.A_log[h];
  const float* bias =
      opt.dt_bias != nullptr ? opt.dt_bias + static_cast<size_t>(h) * static_cast<size_t>(k_dim) : nullptr;
  for (int d = 0; d < k_dim; ++d) out[d] = KdaGate(bias != nullptr ? out[d] + bias[d] : out[d], a_log);
}

inline float LoadBeta(const ConstBuf& beta, int64_t row) {
  return LoadAsFloat(beta.data, beta.dtype, static_cast<size_t>(row));
}

// The states of chunk_kda's sequence n ([H, K, V] each, see ChunkKdaArgs):
// where its initial state is read from (null: zeros) and where its final state
// goes (null: nowhere). A padding sequence (pool form, index < 0) has neither.
inline bool IsPaddingSequence(const ChunkKdaArgs& a, int64_t n) {
  return a.state_indices != nullptr && a.state_indices[n] < 0;
}
inline size_t SequenceStateOffset(const ChunkKdaArgs& a, int64_t n) {
  const int64_t slot = a.state_indices != nullptr ? a.state_indices[n] : n;
  return static_cast<size_t>(slot) * static_cast<size_t>(a.H) * static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
}
inline const float* SequenceInitialState(const ChunkKdaArgs& a, int64_t n) {
  if (IsPaddingSequence(a, n) || (a.has_initial_state != nullptr && a.has_initial_state[n] == 0)) return nullptr;
  const float* base = a.state_indices != nullptr ? a.state : a.initial_state;
  return base != nullptr ? base + SequenceStateOffset(a, n) : nullptr;
}
inline float* SequenceFinalState(const ChunkKdaArgs& a, int64_t n) {
  if (!a.output_final_state || IsPaddingSequence(a, n)) return nullptr;
  return (a.state_indices != nullptr ? a.state : a.final_state) + SequenceStateOffset(a, n);
}

// The reference kernels without validation (callers validate first).
void ChunkKdaReferenceUnchecked(const ChunkKdaArgs& a);
void FusedRecurrentKdaReferenceUnchecked(const RecurrentKdaArgs& a);

}  // namespace kda::internal
