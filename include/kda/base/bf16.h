// bfloat16 storage type. g++ 12 has no C++ __bf16 and no <stdfloat>, so this
// is a 16-bit struct: the upper half of an IEEE float32, rounded to nearest
// even on conversion (the rounding every bf16 cast point of the design uses).
#pragma once

#include <cstdint>
#include <cstring>

namespace kda {

struct BF16 {
  uint16_t bits = 0;

  static BF16 FromBits(uint16_t b) {
    BF16 r;
    r.bits = b;
    return r;
  }
};

// Round-to-nearest-even float32 -> bfloat16. NaN stays a (quiet) NaN.
inline BF16 ToBF16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffU) > 0x7f800000U) return BF16::FromBits(static_cast<uint16_t>((u >> 16) | 0x40U));
  const uint32_t lsb = (u >> 16) & 1U;
  u += 0x7fffU + lsb;
  return BF16::FromBits(static_cast<uint16_t>(u >> 16));
}

inline float ToFloat(BF16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The float32 value of rounding f to bfloat16 (a bf16 cast point in fp32 arithmetic).
inline float RoundBF16(float f) { return ToFloat(ToBF16(f)); }

}  // namespace kda
