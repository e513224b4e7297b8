// Q8 blocks in registers, for the per-ISA projection code (kernels/gemm/gemm_simd.cc, the small-M
// kernels; kernels/gemm/tile_gemm_simd.cc, the tile GEMM). Included inside kda::KDA_TARGET_NS.
#pragma once

#include <cstdint>

#include "kernels/isa/target.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {

// Vec::kLanes int8 values as fp32 (exact).
KDA_INLINE Vec::Reg LoadI8(const int8_t* p) {
#if KDA_TARGET == KDA_TARGET_AVX512
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif KDA_TARGET == KDA_TARGET_AVX2
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  using I8 = int8_t __attribute__((vector_size(Vec::kLanes)));
  I8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return __builtin_convertvector(v, Vec::Reg);
#endif
}

#if KDA_TARGET == KDA_TARGET_AVX512
// A Q8 block (32 int8 values at q) times its scale s as 32 bf16 in input order: two registers
// dequantized (fp16(d) * q: exact in fp32), rounded to bf16 (nearest even) and packed by one
// vcvtne2ps2bf16 (AVX512-BF16, beyond the target's -m flags: callers run where it exists).
[[gnu::always_inline, gnu::target("avx512bf16")]] inline __m512bh Q8BlockBF16(const int8_t* q, __m512 s) {
  const __m512 lo = _mm512_mul_ps(LoadI8(q), s);
  const __m512 hi = _mm512_mul_ps(LoadI8(q + 16), s);
  return _mm512_cvtne2ps_pbh(hi, lo);  // lo -> elements 0..15, hi -> 16..31
}
#endif

}  // namespace kda::KDA_TARGET_NS
