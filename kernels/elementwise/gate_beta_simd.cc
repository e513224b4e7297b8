// The optimized forget gate and beta, compiled once per instruction set
// (kernels/isa/target.h): loops over one lane's softplus and sigmoid
// (kernels/isa/vec.h) that GCC vectorises for the target (this file is built
// with -fno-trapping-math so that it if-converts softplus's selects). Host
// side and plain reference: elementwise.cc.
#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// g[d] = neg_a * softplus(raw[d] (+ bias[d])) over one head's row (g may be raw).
template <bool kBias, class TR>
KDA_INLINE void GateRowOf(float* g, const TR* raw, const float* bias, float neg_a, int len) {
#pragma omp simd
  for (int d = 0; d < len; ++d) {
    const float x = LoadF(raw[d]);
    g[d] = neg_a * Softplus(kBias ? x + bias[d] : x);
  }
}

// g[d] = lower_bound * sigmoid(a * (raw[d] (+ bias[d]))) over one head's row (g may be raw).
template <bool kBias, class TR>
KDA_INLINE void LowerBoundRowOf(float* g, const TR* raw, const float* bias, float a, float lower_bound, int len) {
#pragma omp simd
  for (int d = 0; d < len; ++d) {
    const float x = LoadF(raw[d]);
    g[d] = lower_bound * Sigmoid<Scalar>(a * (kBias ? x + bias[d] : x));
  }
}

template <class TR, class TL>
KDA_INLINE void GateBetaRows(float* g, float* beta, const TR* raw, const TL* logits, const float* a,
                             const float* dt_bias, int64_t t0, int64_t t1, int H, int K, float lower_bound,
                             float beta_scale) {
  const int64_t p = static_cast<int64_t>(H) * K;
  for (int64_t t = t0; t < t1; ++t) {
    for (int h = 0; h < H; ++h) {
      const int64_t base = t * p + static_cast<int64_t>(h) * K;
      const float* bias = dt_bias + static_cast<int64_t>(h) * K;
      if (lower_bound < 0.0F) {
        LowerBoundRowOf<true>(g + base, raw + base, bias, a[h], lower_bound, K);
      } else {
        GateRowOf<true>(g + base, raw + base, bias, a[h], K);
      }
    }
#pragma omp simd
    for (int h = 0; h < H; ++h) beta[t * H + h] = beta_scale * Sigmoid<Scalar>(LoadF(logits[t * H + h]));
  }
}

}  // namespace

void GateBetaF32(float* g, float* beta, const float* raw, const float* logits, const float* a, const float* dt_bias,
                 int64_t t0, int64_t t1, int H, int K, float lower_bound, float beta_scale) {
  GateBetaRows(g, beta, raw, logits, a, dt_bias, t0, t1, H, K, lower_bound, beta_scale);
}
void GateBetaBF16(float* g, float* beta, const BF16* raw, const BF16* logits, const float* a, const float* dt_bias,
                  int64_t t0, int64_t t1, int H, int K, float lower_bound, float beta_scale) {
  GateBetaRows(g, beta, raw, logits, a, dt_bias, t0, t1, H, K, lower_bound, beta_scale);
}

void GateRow(float* g, const float* bias, float neg_a, int len) {
  if (bias != nullptr) {
    GateRowOf<true>(g, g, bias, neg_a, len);
  } else {
    GateRowOf<false>(g, g, bias, neg_a, len);
  }
}

void LowerBoundGateRow(float* g, const float* bias, float a, float lower_bound, int len) {
  if (bias != nullptr) {
    LowerBoundRowOf<true>(g, g, bias, a, lower_bound, len);
  } else {
    LowerBoundRowOf<false>(g, g, bias, a, lower_bound, len);
  }
}

}  // namespace kda::KDA_TARGET_NS
