// The optimized KDA kernels compiled for AVX2 + FMA (CMake adds -mavx2 -mfma
// to this file only).
#include "kernels/kda/optimized.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstdint>

#include "kda/base/bf16.h"

namespace kda::internal {
namespace {

struct VecAvx2 {
  using Reg = __m256;
  using Mask = __m256;
  static constexpr int kLanes = 8;

  static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  static Reg Set1(float x) { return _mm256_set1_ps(x); }
  static Reg Zero() { return _mm256_setzero_ps(); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg Mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg Sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg Div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Mask Less(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static Reg Select(Mask m, Reg if_true, Reg if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static bool Any(Mask m) { return _mm256_movemask_ps(m) != 0; }
  static float ReduceAdd(Reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  // e^x as in the AVX-512 file, with 2^n built from exponent bits: below
  // -87.3 (2^-126) the result is flushed to 0 (the reference would give a
  // subnormal < 1.2e-38).
  static Reg Exp(Reg x) {
    const Reg tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654F), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0F)), _mm256_set1_ps(-87.33654F));
    const Reg n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341F)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375F), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4F), r);
    Reg y = _mm256_set1_ps(1.9875691500e-4F);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3F));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3F));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2F));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1F));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1F));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0F));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
  }

  static Reg LoadBF16(const BF16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // Round to nearest even (as kda::ToBF16), NaN kept a quiet NaN.
  static void StoreBF16(BF16* p, Reg x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // 8 x 32-bit values < 2^16 to 8 x 16-bit: pack within 128-bit lanes, then gather the two lanes.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

}  // namespace
}  // namespace kda::internal

#include "kernels/kda/optimized_impl.h"

namespace kda::internal {

IsaKernels Avx2Kernels() {
  IsaKernels k;
  k.chunk_task = &RunChunkTask<VecAvx2, 2>;
  k.recurrent_task = &RunRecurrentTask<VecAvx2, 4>;
  k.column_block = 2 * VecAvx2::kLanes;
  return k;
}

}  // namespace kda::internal

#else  // not built for AVX2

namespace kda::internal {

IsaKernels Avx2Kernels() { return {}; }

}  // namespace kda::internal

#endif
