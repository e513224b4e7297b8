// Branch-free fp32 exp/log/sigmoid/silu/softplus written so that GCC
// vectorises loops over them (`#pragma omp simd`), for the layer's
// element-wise ops. Accuracy: ExpF within 2 ulp of expf on [-87, 88]
// (0 below, where expf is denormal or 0); LogF within 2 ulp for normal
// positive inputs.
#pragma once

#include <cstdint>
#include <cstring>

#include "kda/base/bf16.h"

namespace kda::vecmath {

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// e^x: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by a
// degree-6 polynomial, 2^n put into the exponent bits.
inline float ExpF(float x) {
  const float xc = x < -87.0F ? -87.0F : (x > 88.0F ? 88.0F : x);
  const float n = __builtin_rintf(xc * 1.44269504088896341F);
  const float r = (xc - n * 0.693145751953125F) - n * 1.428606765330187045e-06F;
  float p = 1.0F / 720.0F;
  p = p * r + 1.0F / 120.0F;
  p = p * r + 1.0F / 24.0F;
  p = p * r + 1.0F / 6.0F;
  p = p * r + 0.5F;
  p = p * r + 1.0F;
  p = p * r + 1.0F;
  const float scale = BitsToFloat(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  const float y = p * scale;
  return x < -87.0F ? 0.0F : y;
}

// log(x) for normal x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
inline float LogF(float x) {
  const uint32_t u = FloatToBits(x);
  int32_t e = static_cast<int32_t>(u >> 23) - 127;
  float m = BitsToFloat((u & 0x007fffffU) | 0x3f800000U);  // [1, 2)
  const bool big = m > 1.41421356F;
  m = big ? m * 0.5F : m;
  e = big ? e + 1 : e;
  const float s = (m - 1.0F) / (m + 1.0F);
  const float s2 = s * s;
  float p = 2.0F / 9.0F;
  p = p * s2 + 2.0F / 7.0F;
  p = p * s2 + 2.0F / 5.0F;
  p = p * s2 + 2.0F / 3.0F;
  p = p * s2 + 2.0F;
  return p * s + static_cast<float>(e) * 0.693147180559945309F;
}

inline float SigmoidF(float x) { return 1.0F / (1.0F + ExpF(-x)); }
inline float SiluF(float x) { return x / (1.0F + ExpF(-x)); }

// log(1 + e^x), = x for x > 20 (the reference's threshold). For x <= 20:
// max(x, 0) + log1p(e^{-|x|}), with log1p(y) = log(1 + y) * y / ((1 + y) - 1)
// to keep the digits of small y.
inline float SoftplusF(float x) {
  const float y = ExpF(x < 0.0F ? x : -x);
  const float u = 1.0F + y;
  const float d = u - 1.0F;
  const float l1p = d == 0.0F ? y : LogF(u) * (y / d);
  const float sp = (x > 0.0F ? x : 0.0F) + l1p;
  return x > 20.0F ? x : sp;
}

inline float LoadF(float v) { return v; }
inline float LoadF(BF16 v) { return BitsToFloat(static_cast<uint32_t>(v.bits) << 16); }

// Round-to-nearest-even store (finite values; NaN handling as ToBF16 for the
// non-vector paths is not needed for activations here, but a NaN stays NaN).
inline void StoreF(float* dst, float v) { *dst = v; }
inline void StoreF(BF16* dst, float v) {
  const uint32_t u = FloatToBits(v);
  const uint32_t rounded = (u + 0x7fffU + ((u >> 16) & 1U)) >> 16;
  const bool nan = (u & 0x7fffffffU) > 0x7f800000U;
  dst->bits = static_cast<uint16_t>(nan ? ((u >> 16) | 0x40U) : rounded);
}

}  // namespace kda::vecmath
