#include "kda/kernels/elementwise.h"

#include <algorithm>
#include <cmath>

#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kernels/elementwise/vec_math.h"

namespace kda {
namespace {

using vecmath::LoadF;
using vecmath::SigmoidF;
using vecmath::SoftplusF;
using vecmath::StoreF;

constexpr int64_t kRowsPerJob = 16;

// ---------------------------------------------------------------- gate, beta

// g[d] = neg_a * softplus(raw[d] (+ bias[d])) over one head's row (g may be raw).
template <bool kBias, class TR>
[[gnu::always_inline]] inline void GateRowOf(float* g, const TR* raw, const float* bias, float neg_a, int len) {
#pragma omp simd
  for (int d = 0; d < len; ++d) {
    const float x = LoadF(raw[d]);
    g[d] = neg_a * SoftplusF(kBias ? x + bias[d] : x);
  }
}

template <class TR, class TL>
[[gnu::always_inline]] inline void GateBetaRows(float* g, float* beta, const TR* raw, const TL* logits,
                                                const float* neg_a, const float* dt_bias, int64_t t0, int64_t t1, int H,
                                                int K) {
  const int64_t p = static_cast<int64_t>(H) * K;
  for (int64_t t = t0; t < t1; ++t) {
    for (int h = 0; h < H; ++h) {
      const int64_t base = t * p + static_cast<int64_t>(h) * K;
      GateRowOf<true>(g + base, raw + base, dt_bias + static_cast<int64_t>(h) * K, neg_a[h], K);
    }
#pragma omp simd
    for (int h = 0; h < H; ++h) beta[t * H + h] = SigmoidF(LoadF(logits[t * H + h]));
  }
}

#define KDA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

KDA_CLONES void GateBetaF32(float* g, float* beta, const float* raw, const float* logits, const float* neg_a,
                            const float* dt_bias, int64_t t0, int64_t t1, int H, int K) {
  GateBetaRows(g, beta, raw, logits, neg_a, dt_bias, t0, t1, H, K);
}
KDA_CLONES void GateBetaBF16(float* g, float* beta, const BF16* raw, const BF16* logits, const float* neg_a,
                             const float* dt_bias, int64_t t0, int64_t t1, int H, int K) {
  GateBetaRows(g, beta, raw, logits, neg_a, dt_bias, t0, t1, H, K);
}

KDA_CLONES void GateRow(float* g, const float* bias, float neg_a, int len) {
  if (bias != nullptr) {
    GateRowOf<true>(g, g, bias, neg_a, len);
  } else {
    GateRowOf<false>(g, g, bias, neg_a, len);
  }
}

// ----------------------------------------------------------- gated RMSNorm

template <class T>
[[gnu::always_inline]] inline void RmsNormRows(T* y, const T* o, const T* gate, const float* w, int64_t r0, int64_t r1,
                                               int V, float eps) {
  for (int64_t r = r0; r < r1; ++r) {  // r = t * H + h
    const T* orow = o + r * V;
    const T* grow = gate + r * V;
    T* yrow = y + r * V;
    float ss = 0.0F;
#pragma omp simd reduction(+ : ss)
    for (int d = 0; d < V; ++d) {
      const float v = LoadF(orow[d]);
      ss += v * v;
    }
    const float rstd = 1.0F / std::sqrt(ss / static_cast<float>(V) + eps);
#pragma omp simd
    for (int d = 0; d < V; ++d) StoreF(yrow + d, LoadF(orow[d]) * rstd * w[d] * SigmoidF(LoadF(grow[d])));
  }
}

KDA_CLONES void RmsNormF32(float* y, const float* o, const float* gate, const float* w, int64_t r0, int64_t r1, int V,
                           float eps) {
  RmsNormRows(y, o, gate, w, r0, r1, V, eps);
}
KDA_CLONES void RmsNormBF16(BF16* y, const BF16* o, const BF16* gate, const float* w, int64_t r0, int64_t r1, int V,
                            float eps) {
  RmsNormRows(y, o, gate, w, r0, r1, V, eps);
}

// ------------------------------------------------------------ residual add

template <class T>
[[gnu::always_inline]] inline void AddRows(T* acc, const T* x, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) StoreF(acc + i, LoadF(acc[i]) + LoadF(x[i]));
}

KDA_CLONES void AddF32(float* acc, const float* x, int64_t i0, int64_t i1) { AddRows(acc, x, i0, i1); }
KDA_CLONES void AddBF16(BF16* acc, const BF16* x, int64_t i0, int64_t i1) { AddRows(acc, x, i0, i1); }

void CheckFloatBuf(DType t, const char* what) {
  Check(t == DType::kF32 || t == DType::kBF16, std::string(what) + " must be F32 or BF16");
}

}  // namespace

void KdaGateBetaReference(float* g, float* beta, ConstBuf raw, ConstBuf logits, const float* A_log,
                          const float* dt_bias, int64_t T, int H, int K) {
  const int64_t p = static_cast<int64_t>(H) * K;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < p; ++c) {
      const float x = LoadAsFloat(raw.data, raw.dtype, static_cast<size_t>(t * p + c));
      g[t * p + c] = KdaGate(x + dt_bias[c], A_log[c / K]);
    }
    for (int h = 0; h < H; ++h) {
      const float x = LoadAsFloat(logits.data, logits.dtype, static_cast<size_t>(t * H + h));
      beta[t * H + h] = 1.0F / (1.0F + std::exp(-x));
    }
  }
}

void KdaGateBeta(float* g, float* beta, ConstBuf raw, ConstBuf logits, const float* A_log, const float* dt_bias,
                 int64_t T, int H, int K) {
  CheckFloatBuf(raw.dtype, "gate input");
  Check(raw.dtype == logits.dtype, "gate and beta inputs must share a dtype");
  std::vector<float> neg_a(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) neg_a[h] = -std::exp(A_log[h]);
  ParallelFor((T + kRowsPerJob - 1) / kRowsPerJob, [&](int64_t job) {
    const int64_t t0 = job * kRowsPerJob;
    const int64_t t1 = std::min(T, t0 + kRowsPerJob);
    if (raw.dtype == DType::kBF16) {
      GateBetaBF16(g, beta, static_cast<const BF16*>(raw.data), static_cast<const BF16*>(logits.data), neg_a.data(),
                   dt_bias, t0, t1, H, K);
    } else {
      GateBetaF32(g, beta, static_cast<const float*>(raw.data), static_cast<const float*>(logits.data), neg_a.data(),
                  dt_bias, t0, t1, H, K);
    }
  });
}

void KdaGateRowInPlace(float* g, const float* bias, float A_log, int len) { GateRow(g, bias, -std::exp(A_log), len); }

void GatedRmsNormReference(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps) {
  for (int64_t r = 0; r < T * H; ++r) {
    float ss = 0.0F;
    for (int d = 0; d < V; ++d) {
      const float v = LoadAsFloat(o.data, o.dtype, static_cast<size_t>(r * V + d));
      ss += v * v;
    }
    const float rstd = 1.0F / std::sqrt(ss / static_cast<float>(V) + eps);
    for (int d = 0; d < V; ++d) {
      const auto i = static_cast<size_t>(r * V + d);
      const float gv = LoadAsFloat(gate.data, gate.dtype, i);
      StoreFromFloat(y.data, y.dtype, i, LoadAsFloat(o.data, o.dtype, i) * rstd * w[d] / (1.0F + std::exp(-gv)));
    }
  }
}

void GatedRmsNorm(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps) {
  CheckFloatBuf(y.dtype, "RMSNorm output");
  Check(o.dtype == y.dtype && gate.dtype == y.dtype, "RMSNorm input, gate and output must share a dtype");
  const int64_t rows = T * H;
  ParallelFor((rows + kRowsPerJob * 4 - 1) / (kRowsPerJob * 4), [&](int64_t job) {
    const int64_t r0 = job * kRowsPerJob * 4;
    const int64_t r1 = std::min(rows, r0 + kRowsPerJob * 4);
    if (y.dtype == DType::kBF16) {
      RmsNormBF16(static_cast<BF16*>(y.data), static_cast<const BF16*>(o.data), static_cast<const BF16*>(gate.data), w,
                  r0, r1, V, eps);
    } else {
      RmsNormF32(static_cast<float*>(y.data), static_cast<const float*>(o.data), static_cast<const float*>(gate.data),
                 w, r0, r1, V, eps);
    }
  });
}

void AddInPlaceReference(MutBuf acc, ConstBuf x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const auto j = static_cast<size_t>(i);
    StoreFromFloat(acc.data, acc.dtype, j, LoadAsFloat(acc.data, acc.dtype, j) + LoadAsFloat(x.data, x.dtype, j));
  }
}

void AddInPlace(MutBuf acc, ConstBuf x, int64_t n) {
  CheckFloatBuf(acc.dtype, "residual sum");
  Check(x.dtype == acc.dtype, "residual add: the addend and the sum must share a dtype");
  constexpr int64_t kPerJob = int64_t{1} << 16;  // elements: memory-bound, big jobs
  ParallelFor((n + kPerJob - 1) / kPerJob, [&](int64_t job) {
    const int64_t i0 = job * kPerJob;
    const int64_t i1 = std::min(n, i0 + kPerJob);
    if (acc.dtype == DType::kBF16) {
      AddBF16(static_cast<BF16*>(acc.data), static_cast<const BF16*>(x.data), i0, i1);
    } else {
      AddF32(static_cast<float*>(acc.data), static_cast<const float*>(x.data), i0, i1);
    }
  });
}

}  // namespace kda
