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
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_gate.h"
#include "kernels/isa/constants.h"
#include "kernels/kda/kda_states.h"

namespace kda::internal {

using kc::kL2NormEps;   // eps of the in-kernel L2 norm: x / sqrt(sum x^2 + eps)
using kc::kMaxHeadDim;  // largest head dim the kernels accept (validated)

// The scale applied to q: options.scale, or K^-0.5 when it is <= 0.
inline float EffectiveScale(const KdaOptions& opt, int k_dim) {
  return opt.scale > 0.0F ? opt.scale : 1.0F / std::sqrt(static_cast<float>(k_dim));
}

// Copies elements [offset, offset + len) of a buffer into out[0, len) as fp32.
inline void LoadRow(const ConstBuf& buf, size_t offset, int len, float* out) {
  for (int d = 0; d < len; ++d) out[d] = LoadAsFloat(buf.data, buf.dtype, offset + static_cast<size_t>(d));
}

inline void L2NormalizeInPlace(float* x, int len) {
  float sum_sq = 0.0F;
  for (int d = 0; d < len; ++d) sum_sq += x[d] * x[d];
  const float norm = std::sqrt(sum_sq + kL2NormEps);
  for (int d = 0; d < len; ++d) x[d] /= norm;
}

// The q row at `offset` (QOffset): optionally L2-normalised, then multiplied by scale.
inline void LoadQ(const ConstBuf& q, size_t offset, int k_dim, const KdaOptions& opt, float scale, float* out) {
  LoadRow(q, offset, k_dim, out);
  if (opt.use_qk_l2norm_in_kernel) L2NormalizeInPlace(out, k_dim);
  for (int d = 0; d < k_dim; ++d) out[d] *= scale;
}

// The k row at `offset` (KOffset): optionally L2-normalised.
inline void LoadK(const ConstBuf& k, size_t offset, int k_dim, const KdaOptions& opt, float* out) {
  LoadRow(k, offset, k_dim, out);
  if (opt.use_qk_l2norm_in_kernel) L2NormalizeInPlace(out, k_dim);
}

// The in-kernel gate of one element of value head h (see KdaOptions).
inline float ActivatedGate(float raw_plus_bias, int h, const KdaOptions& opt) {
  if (opt.use_lower_bound) {
    return KdaLowerBoundGate(raw_plus_bias, opt.A_log != nullptr ? std::exp(opt.A_log[h]) : 1.0F, opt.lower_bound);
  }
  return KdaGate(raw_plus_bias, opt.A_log[h]);
}

// The gate's width: K values per value head and token (KDA), or 1 (GDN, a scalar gate).
template <class Args>
int GateWidth(const Args& a) {
  return a.scalar_gate ? 1 : a.K;
}

// Log-decay row of value head h of token t (`width` values, [T, HV, width]):
// as given, or activated in the kernel from the raw gate with A_log[h] and
// dt_bias[h * width + d].
inline void LoadGate(const ConstBuf& g, int64_t t, int h, int value_heads, int width, const KdaOptions& opt,
                     float* out) {
  LoadRow(g, (static_cast<size_t>(t) * value_heads + h) * width, width, out);
  if (!opt.use_gate_in_kernel) return;
  const float* bias =
      opt.dt_bias != nullptr ? opt.dt_bias + static_cast<size_t>(h) * static_cast<size_t>(width) : nullptr;
  for (int d = 0; d < width; ++d) out[d] = ActivatedGate(bias != nullptr ? out[d] + bias[d] : out[d], h, opt);
}

// beta as the kernel uses it: the stored value, or beta_scale * sigmoid(logit).
inline float ActivatedBeta(float x, const KdaOptions& opt) {
  return opt.use_beta_sigmoid_in_kernel ? opt.beta_scale / (1.0F + std::exp(-x)) : x;
}

// beta of element i ([T, HV] or, per value, [T, HV, V]).
inline float LoadBeta(const ConstBuf& beta, size_t i, const KdaOptions& opt) {
  return ActivatedBeta(LoadAsFloat(beta.data, beta.dtype, i), opt);
}

// Element (d, j) of one head's state stored K-major ([K][V]) or V-first ([V][K]).
inline size_t StateIndex(int d, int j, int k_dim, int v_dim, bool v_first) {
  return v_first ? static_cast<size_t>(j) * k_dim + d : static_cast<size_t>(d) * v_dim + j;
}

// Copies one head's state between a working [K][V] copy and its stored layout:
// from src, and into dst from element `offset` on (F32, or BF16 or F16 rounded once).
inline void LoadHeadState(const float* src, int k_dim, int v_dim, bool v_first, float* work) {
  for (int d = 0; d < k_dim; ++d) {
    for (int j = 0; j < v_dim; ++j)
      work[static_cast<size_t>(d) * v_dim + j] = src[StateIndex(d, j, k_dim, v_dim, v_first)];
  }
}
inline void StoreHeadState(const float* work, int k_dim, int v_dim, bool v_first, const MutBuf& dst, size_t offset) {
  for (int d = 0; d < k_dim; ++d) {
    for (int j = 0; j < v_dim; ++j) {
      StoreFromFloat(dst.data, dst.dtype, offset + StateIndex(d, j, k_dim, v_dim, v_first),
                     work[static_cast<size_t>(d) * v_dim + j]);
    }
  }
}

// The states of chunk_kda's sequence n ([HV, K, V] each, see ChunkKdaArgs):
// where its initial state is read from (null: zeros) and where its final state
// goes (null: nowhere). A padding sequence (pool form, index < 0) has neither.
inline bool IsPaddingSequence(const ChunkKdaArgs& a, int64_t n) {
  return a.state_indices != nullptr && a.state_indices[n] < 0;
}
inline size_t SequenceStateOffset(const ChunkKdaArgs& a, int64_t n) {
  const int64_t slot = a.state_indices != nullptr ? a.state_indices[n] : n;
  return static_cast<size_t>(slot) * static_cast<size_t>(a.HV) * static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
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

// The intermediate states of a chunk_kda run (ChunkKdaArgs::intermediate_states,
// kernels/kda/chunk_kda_intermediate.cc): the constructor writes each
// sequence's chunk 0 (before the kernel may overwrite its initial state) and
// sets args() up to emit the later chunks as snapshots straight into the
// buffer, in its dtype.
class IntermediateStates {
 public:
  explicit IntermediateStates(const ChunkKdaArgs& a);
  // a without intermediate_states, with the snapshots.
  const ChunkKdaArgs& args() const { return run_; }

 private:
  ChunkKdaArgs run_;
  std::vector<int64_t> snapshot_cu_, snapshot_offsets_;
  std::vector<void*> snapshot_states_;
};

// Runs the unchecked chunk kernel `run` on a, with its intermediate states.
template <class Run>
void RunWithIntermediateStates(const ChunkKdaArgs& a, const Run& run) {
  run(IntermediateStates(a).args());
}

// The reference kernels without validation (callers validate first).
void ChunkKdaReferenceUnchecked(const ChunkKdaArgs& a);
void FusedRecurrentKdaReferenceUnchecked(const RecurrentKdaArgs& a);

}  // namespace kda::internal
