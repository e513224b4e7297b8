// Reference fused_recurrent_kda: the recurrence of design §2.5, token by
// token, on a working [K][V] copy of each (sequence, value head) state:
//   S <- diag(exp(g)) S          (a scalar gate: S <- exp(g) S)
//   S <- S + k (beta * (v - S^T k))^T   (without the delta correction: S + k (beta * v)^T)
//   o  = S^T (scale q)
// The states are read and written as RecurrentKdaArgs describes (contiguous
// or pool form, slots per token, per-token outputs); a padding sequence has
// zero outputs and touches no state.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/parallel.h"
#include "kda/kernels/fused_recurrent_kda_reference.h"
#include "kda/kernels/kda_args.h"
#include "kernels/kda/kda_common.h"

namespace kda {
namespace internal {

void FusedRecurrentKdaReferenceUnchecked(const RecurrentKdaArgs& a) {
  const float scale = EffectiveScale(a.options, a.K);
  const int k_dim = a.K;
  const int v_dim = a.V;
  const size_t state_size = static_cast<size_t>(k_dim) * static_cast<size_t>(v_dim);
  const int64_t num_tasks = a.N * a.HV;
  const int64_t num_workers = std::max<int64_t>(1, std::min<int64_t>(NumThreads(), num_tasks));
  // One working state per worker, allocated before the loop (its body neither allocates nor throws) and kept per
  // calling thread, so that a steady stream of decode steps allocates nothing.
  thread_local std::vector<float> work;
  if (work.size() < static_cast<size_t>(num_workers) * state_size)
    work.resize(static_cast<size_t>(num_workers) * state_size);
  float* const work_base = work.data();  // the workers' threads see their own (empty) thread_local

  ParallelFor(num_workers, [&](int64_t worker) {
    float* s = work_base + static_cast<size_t>(worker) * state_size;
    for (int64_t task = worker; task < num_tasks; task += num_workers) {
      const int64_t n = task / a.HV;
      const int h = static_cast<int>(task % a.HV);
      const RecurrentStates st = RecurrentStatesOf(a, n);
      const int64_t bos = a.cu_seqlens[n];
      const int64_t eos = a.cu_seqlens[n + 1];
      if (st.padding) {
        for (int64_t t = bos; t < eos; ++t) {
          const size_t out_base = static_cast<size_t>(t * a.HV + h) * static_cast<size_t>(v_dim);
          for (int j = 0; j < v_dim; ++j) StoreFromFloat(a.o.data, a.o.dtype, out_base + j, 0.0F);
        }
        continue;
      }
      const size_t head_off = static_cast<size_t>(h) * state_size;
      if (st.initial != nullptr) {
        LoadHeadState(st.initial + head_off, k_dim, v_dim, a.state_v_first, s);
      } else {
        std::fill_n(s, state_size, 0.0F);
      }
      const int kh = KeyHeadOf(h, a.H, a.HV);
      // K, V <= kMaxHeadDim is validated, so the rows fit on the stack.
      float q[kMaxHeadDim];
      float k[kMaxHeadDim];
      float v[kMaxHeadDim];
      float g[kMaxHeadDim];
      float beta[kMaxHeadDim];
      float delta[kMaxHeadDim];
      float o[kMaxHeadDim];
      for (int64_t t = bos; t < eos; ++t) {
        const auto value_row = static_cast<size_t>(t * a.HV + h);
        LoadQ(a.q, QOffset(a, t, kh), k_dim, a.options, scale, q);
        LoadK(a.k, KOffset(a, t, kh), k_dim, a.options, k);
        LoadRow(a.v, VOffset(a, t, h), v_dim, v);
        LoadGate(a.g, t, h, a.HV, GateWidth(a), a.options, g);
        const float scalar_decay = a.scalar_gate ? std::exp(g[0]) : 0.0F;  // GDN: one decay for every row
        const float head_beta = a.beta_per_value ? 0.0F : LoadBeta(a.beta, value_row, a.options);
        for (int j = 0; j < v_dim; ++j) {
          beta[j] = a.beta_per_value ? LoadBeta(a.beta, value_row * v_dim + j, a.options) : head_beta;
        }
        // Decay, then S^T k of the decayed state (0 without the delta correction).
        const bool correct = a.options.delta_correction;
        for (int j = 0; j < v_dim; ++j) delta[j] = 0.0F;
        for (int d = 0; d < k_dim; ++d) {
          const float decay = a.scalar_gate ? scalar_decay : std::exp(g[d]);
          float* s_d = s + static_cast<size_t>(d) * v_dim;
          for (int j = 0; j < v_dim; ++j) {
            s_d[j] *= decay;
            if (correct) delta[j] += k[d] * s_d[j];
          }
        }
        // Delta rule: S += k (beta * (v - S^T k))^T.
        for (int j = 0; j < v_dim; ++j) delta[j] = beta[j] * (v[j] - delta[j]);
        for (int j = 0; j < v_dim; ++j) o[j] = 0.0F;
        for (int d = 0; d < k_dim; ++d) {
          float* s_d = s + static_cast<size_t>(d) * v_dim;
          for (int j = 0; j < v_dim; ++j) {
            s_d[j] += k[d] * delta[j];
            o[j] += q[d] * s_d[j];  // o = S^T (scale q) with the updated S
          }
        }
        if (a.options.D != nullptr) {  // Mamba2's skip: o + D v
          for (int j = 0; j < v_dim; ++j) o[j] += a.options.D[h] * v[j];
        }
        for (int j = 0; j < v_dim; ++j) StoreFromFloat(a.o.data, a.o.dtype, value_row * v_dim + j, o[j]);
        float* dst = TokenStateDestination(a, n, t - bos, eos - bos);
        if (dst != nullptr) StoreHeadState(s, k_dim, v_dim, a.state_v_first, {dst, DType::kF32}, head_off);
      }
      // An empty sequence's final state (contiguous form) is its initial state.
      float* empty_final = EmptySequenceFinalState(a, n);
      if (bos == eos && empty_final != nullptr && empty_final != st.initial) {
        StoreHeadState(s, k_dim, v_dim, a.state_v_first, {empty_final, DType::kF32}, head_off);
      }
    }
  });
}

}  // namespace internal

void fused_recurrent_kda_reference(const RecurrentKdaArgs& a) {
  ValidateRecurrentKda(a);
  internal::FusedRecurrentKdaReferenceUnchecked(a);
}

}  // namespace kda
