// Reference fused_recurrent_kda: one token per sequence, the recurrence of
// design §2.5 applied in place to state[state_indices[n]] (fp32, [K][V]):
//   S <- diag(exp(g)) S
//   S <- S + beta k (v - S^T k)^T
//   o  = S^T (scale q)
// A negative index marks padding: zero output, no state read or written.
#include <cmath>
#include <cstddef>
#include <cstdint>

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

  ParallelFor(a.N * a.H, [&](int64_t task) {
    const int64_t n = task / a.H;
    const int h = static_cast<int>(task % a.H);
    const int64_t tok_head = n * a.H + h;
    const size_t out_base = static_cast<size_t>(tok_head) * static_cast<size_t>(v_dim);
    const int32_t idx = a.state_indices[n];
    if (idx < 0) {
      for (int j = 0; j < v_dim; ++j) StoreFromFloat(a.o.data, a.o.dtype, out_base + j, 0.0F);
      return;
    }

    // K <= kMaxHeadDim is validated, so the rows fit on the stack.
    float q[kMaxHeadDim];
    float k[kMaxHeadDim];
    float v[kMaxHeadDim];
    float g[kMaxHeadDim];
    float delta[kMaxHeadDim];
    float o[kMaxHeadDim];
    LoadQ(a.q, tok_head, k_dim, a.options, scale, q);
    LoadK(a.k, tok_head, k_dim, a.options, k);
    LoadRow(a.v, tok_head, v_dim, v);
    LoadGate(a.g, tok_head, h, k_dim, a.options, g);
    const float beta = LoadBeta(a.beta, tok_head);

    float* s = a.state + (static_cast<size_t>(idx) * static_cast<size_t>(a.H) + static_cast<size_t>(h)) * state_size;

    // Decay, then S^T k of the decayed state.
    for (int j = 0; j < v_dim; ++j) delta[j] = 0.0F;
    for (int d = 0; d < k_dim; ++d) {
      const float decay = std::exp(g[d]);
      float* s_d = s + static_cast<size_t>(d) * v_dim;
      for (int j = 0; j < v_dim; ++j) {
        s_d[j] *= decay;
        delta[j] += k[d] * s_d[j];
      }
    }
    // Delta rule: S += k (beta (v - S^T k))^T.
    for (int j = 0; j < v_dim; ++j) delta[j] = beta * (v[j] - delta[j]);
    for (int j = 0; j < v_dim; ++j) o[j] = 0.0F;
    for (int d = 0; d < k_dim; ++d) {
      float* s_d = s + static_cast<size_t>(d) * v_dim;
      for (int j = 0; j < v_dim; ++j) {
        s_d[j] += k[d] * delta[j];
        o[j] += q[d] * s_d[j];  // o = S^T (scale q) with the updated S
      }
    }
    for (int j = 0; j < v_dim; ++j) StoreFromFloat(a.o.data, a.o.dtype, out_base + j, o[j]);
  });
}

}  // namespace internal

void fused_recurrent_kda_reference(const RecurrentKdaArgs& a) {
  ValidateRecurrentKda(a);
  internal::FusedRecurrentKdaReferenceUnchecked(a);
}

}  // namespace kda
