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

// The rounding rule of every bf16 cast point: float32 bits u -> bfloat16 bits
// (in the low 16 bits), round to nearest even, NaN kept a (quiet) NaN. U is
// uint32_t or a GCC vector of uint32_t, so that the scalar ToBF16 and the
// vector kernels (kernels/isa/vec.h) round by this one definition. Always
// inlined: no out-of-line copy compiled for one instruction set can be shared
// with code compiled for another.
//
// BF16RoundedFiniteBits is the same rounding of a finite value, its result
// left in place as float32 bits (low 16 bits zero). (The int8 kernels round
// their dequantized weights, finite products of at most 18 significant bits,
// by a floating-point split that gives the same bits: kernels/gemm/gemm_simd.cc.)
template <class U>
[[gnu::always_inline]] inline U BF16RoundedFiniteBits(U u) {
  return (u + (0x7fffU + ((u >> 16) & 1U))) & 0xffff0000U;
}

template <class U>
[[gnu::always_inline]] inline U BF16RoundedBits(U u) {
  const U quiet_nan = (u >> 16) | 0x40U;
  const U rounded = BF16RoundedFiniteBits(u) >> 16;
  return (u & 0x7fffffffU) > 0x7f800000U ? quiet_nan : rounded;
}

// Round-to-nearest-even float32 -> bfloat16. NaN stays a (quiet) NaN.
inline BF16 ToBF16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return BF16::FromBits(static_cast<uint16_t>(BF16RoundedBits(u)));
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
