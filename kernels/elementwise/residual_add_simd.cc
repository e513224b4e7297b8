// The optimized residual add and the bf16 conversions, compiled once per
// instruction set (kernels/isa/target.h); loops that GCC vectorises for the
// target, rounding by the one bf16 rule (kda::BF16RoundedBits). Host side and
// plain references: elementwise.cc.
#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

template <class T>
KDA_INLINE void AddRows(T* acc, const T* x, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) StoreF(acc + i, LoadF(acc[i]) + LoadF(x[i]));
}

}  // namespace

void AddF32(float* acc, const float* x, int64_t i0, int64_t i1) { AddRows(acc, x, i0, i1); }
void AddBF16(BF16* acc, const BF16* x, int64_t i0, int64_t i1) { AddRows(acc, x, i0, i1); }

void ToBF16Range(BF16* y, const float* x, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) StoreF(y + i, x[i]);
}

void ToF32Range(float* y, const BF16* x, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) y[i] = LoadF(x[i]);
}

}  // namespace kda::KDA_TARGET_NS
