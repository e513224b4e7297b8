// IEEE float16 storage type and its conversions: exact fp16 -> fp32, and
// fp32 -> fp16 rounded to nearest even (overflow: +-inf; NaN: a quiet NaN).
// The bit conversions are always inlined so that the per-ISA kernels
// (kernels/isa/target.h) can use this one definition, as with bf16.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace kda {

struct F16 {
  uint16_t bits = 0;

  static F16 FromBits(uint16_t b) {
    F16 r;
    r.bits = b;
    return r;
  }
};

// fp16 bits -> fp32 bits (exact).
[[gnu::always_inline]] inline uint32_t F16ToF32Bits(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000U) << 16;
  const uint32_t e = (static_cast<uint32_t>(h) >> 10) & 0x1fU;
  const uint32_t m = static_cast<uint32_t>(h) & 0x3ffU;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in fp32
    const float v = static_cast<float>(m) * 5.9604644775390625e-8F;
    uint32_t u = 0;
    __builtin_memcpy(&u, &v, sizeof(u));
    return sign | u;
  }
  if (e == 31) return sign | 0x7f800000U | (m << 13);  // infinity or NaN (payload kept)
  return sign | ((e + 112U) << 23) | (m << 13);
}

// fp32 bits -> fp16 bits, round to nearest even.
[[gnu::always_inline]] inline uint16_t F32ToF16Bits(uint32_t x) {
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000U);
  x &= 0x7fffffffU;
  if (x > 0x7f800000U) return static_cast<uint16_t>(sign | 0x7e00U | ((x >> 13) & 0x3ffU));  // NaN, quiet
  if (x >= 0x477ff000U) return static_cast<uint16_t>(sign | 0x7c00U);  // >= 65520 rounds to infinity
  if (x < 0x38800000U) {
    // Below 2^-14: a subnormal half m * 2^-24. Adding 0.5 (2^-1) to |f| puts
    // the bits of m at the bottom of the mantissa, rounded to nearest even by
    // the addition itself.
    float f = 0.0F;
    __builtin_memcpy(&f, &x, sizeof(f));
    const float shifted = f + 0.5F;
    uint32_t u = 0;
    __builtin_memcpy(&u, &shifted, sizeof(u));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(u - 0x3f000000U));
  }
  // Normal: drop 13 mantissa bits, nearest even, rebias the exponent (127 -> 15).
  const uint32_t rounded = x + 0xfffU + ((x >> 13) & 1U);
  return static_cast<uint16_t>(sign | ((rounded - (112U << 23)) >> 13));
}

inline F16 ToF16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return F16::FromBits(F32ToF16Bits(u));
}

inline float ToFloat(F16 h) {
  const uint32_t u = F16ToF32Bits(h.bits);
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The float32 value of rounding f to float16.
inline float RoundF16(float f) { return ToFloat(ToF16(f)); }

}  // namespace kda
