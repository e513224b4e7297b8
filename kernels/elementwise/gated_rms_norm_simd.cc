// The optimized gated RMSNorms (the delta-rule layers' per head, Mamba2's over
// groups), compiled once per instruction set (kernels/isa/target.h); loops that
// GCC vectorises for the target. Host side and plain reference: elementwise.cc.
#include <cstdint>

#include "kda/base/bf16.h"
#include "kda/kernels/elementwise.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// The gate factor of one lane: sigmoid(z), or silu(z) = z * sigmoid(z).
template <GateActivation kAct>
KDA_INLINE float Gate(float z) {
  if constexpr (kAct == GateActivation::kSilu) {
    return z * Sigmoid<Scalar>(z);
  } else {
    return Sigmoid<Scalar>(z);
  }
}

template <GateActivation kAct, class T>
KDA_INLINE void RmsNormRows(T* y, const T* o, const T* gate, const float* w, int64_t r0, int64_t r1, int V, float eps) {
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
    const float rstd = 1.0F / __builtin_sqrtf(ss / static_cast<float>(V) + eps);
#pragma omp simd
    for (int d = 0; d < V; ++d) StoreF(yrow + d, LoadF(orow[d]) * rstd * w[d] * Gate<kAct>(LoadF(grow[d])));
  }
}

// Mamba2's: rows [r0, r1) of [T * groups, width] (r = t * groups + j), the
// weight of group j at w + j * width. g [width]: the row's fp32 gated values,
// kept between the mean square and the scaling (one silu per element); the
// norm-then-gate form keeps silu(z) there instead.
template <SsdNorm kForm, class T>
KDA_INLINE void RmsNormGroupRows(T* y, const T* o, const T* z, const float* w, int64_t r0, int64_t r1, int groups,
                                 int64_t width, float eps, float* g) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* orow = o + r * width;
    const T* zrow = z + r * width;
    T* yrow = y + r * width;
    if constexpr (kForm == SsdNorm::kGateOnly) {
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) {
        StoreF(yrow + c, LoadF(orow[c]) * Gate<GateActivation::kSilu>(LoadF(zrow[c])));
      }
      continue;
    }
    // The gate-then-norm form keeps the gated values in g and normalises them; the norm-then-gate form
    // normalises o and keeps the gates in g.
    constexpr bool kGateFirst = kForm == SsdNorm::kGateThenNorm;
    float ss = 0.0F;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < width; ++c) {
      const float ov = LoadF(orow[c]);
      const float gate = Gate<GateActivation::kSilu>(LoadF(zrow[c]));
      const float v = kGateFirst ? ov * gate : ov;
      g[c] = kGateFirst ? v : gate;
      ss += v * v;
    }
    const float rstd = 1.0F / __builtin_sqrtf(ss / static_cast<float>(width) + eps);
    const float* wrow = w + (r % groups) * width;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) {
      const float scaled = g[c] * rstd * wrow[c];
      StoreF(yrow + c, kGateFirst ? scaled : LoadF(orow[c]) * scaled);
    }
  }
}

}  // namespace

template <SsdNorm kForm>
void RmsNormGroupsF32(float* y, const float* o, const float* z, const float* w, int64_t r0, int64_t r1, int groups,
                      int64_t width, float eps, float* g) {
  RmsNormGroupRows<kForm>(y, o, z, w, r0, r1, groups, width, eps, g);
}
template <SsdNorm kForm>
void RmsNormGroupsBF16(BF16* y, const BF16* o, const BF16* z, const float* w, int64_t r0, int64_t r1, int groups,
                       int64_t width, float eps, float* g) {
  RmsNormGroupRows<kForm>(y, o, z, w, r0, r1, groups, width, eps, g);
}

template <GateActivation kAct>
void RmsNormF32(float* y, const float* o, const float* gate, const float* w, int64_t r0, int64_t r1, int V, float eps) {
  RmsNormRows<kAct>(y, o, gate, w, r0, r1, V, eps);
}
template <GateActivation kAct>
void RmsNormBF16(BF16* y, const BF16* o, const BF16* gate, const float* w, int64_t r0, int64_t r1, int V, float eps) {
  RmsNormRows<kAct>(y, o, gate, w, r0, r1, V, eps);
}

template void RmsNormF32<GateActivation::kSigmoid>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                                   int, float);
template void RmsNormF32<GateActivation::kSilu>(float*, const float*, const float*, const float*, int64_t, int64_t, int,
                                                float);
template void RmsNormBF16<GateActivation::kSigmoid>(BF16*, const BF16*, const BF16*, const float*, int64_t, int64_t,
                                                    int, float);
template void RmsNormBF16<GateActivation::kSilu>(BF16*, const BF16*, const BF16*, const float*, int64_t, int64_t, int,
                                                 float);
template void RmsNormGroupsF32<SsdNorm::kGateThenNorm>(float*, const float*, const float*, const float*, int64_t,
                                                       int64_t, int, int64_t, float, float*);
template void RmsNormGroupsBF16<SsdNorm::kGateThenNorm>(BF16*, const BF16*, const BF16*, const float*, int64_t, int64_t,
                                                        int, int64_t, float, float*);
template void RmsNormGroupsF32<SsdNorm::kNormThenGate>(float*, const float*, const float*, const float*, int64_t,
                                                       int64_t, int, int64_t, float, float*);
template void RmsNormGroupsBF16<SsdNorm::kNormThenGate>(BF16*, const BF16*, const BF16*, const float*, int64_t, int64_t,
                                                        int, int64_t, float, float*);
template void RmsNormGroupsF32<SsdNorm::kGateOnly>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                                   int, int64_t, float, float*);
template void RmsNormGroupsBF16<SsdNorm::kGateOnly>(BF16*, const BF16*, const BF16*, const float*, int64_t, int64_t,
                                                    int, int64_t, float, float*);

}  // namespace kda::KDA_TARGET_NS
