// The optimized gated RMSNorm, compiled once per instruction set
// (kernels/isa/target.h); loops that GCC vectorises for the target. Host side
// and plain reference: elementwise.cc.
#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

template <class T>
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
    for (int d = 0; d < V; ++d) StoreF(yrow + d, LoadF(orow[d]) * rstd * w[d] * Sigmoid<Scalar>(LoadF(grow[d])));
  }
}

}  // namespace

void RmsNormF32(float* y, const float* o, const float* gate, const float* w, int64_t r0, int64_t r1, int V, float eps) {
  RmsNormRows(y, o, gate, w, r0, r1, V, eps);
}
void RmsNormBF16(BF16* y, const BF16* o, const BF16* gate, const float* w, int64_t r0, int64_t r1, int V, float eps) {
  RmsNormRows(y, o, gate, w, r0, r1, V, eps);
}

}  // namespace kda::KDA_TARGET_NS
