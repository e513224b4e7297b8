// The optimized KDA kernels compiled for AVX-512 (AVX512F; CMake adds
// -mavx512f -mavx2 -mfma to this file only). Zen 4 runs a 512-bit FMA as two
// 256-bit halves, so the gain over AVX2 there comes from halving the
// instruction count (loads, broadcasts, stores) per FMA, not from the FMA rate.
#include "kernels/kda/optimized.h"

#if defined(__AVX512F__) && defined(__FMA__)
// g++ 12 warns about the intentionally undefined source operands in its own
// AVX-512 headers (GCC bug 105593); the pragma covers only those headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kda/base/bf16.h"

namespace kda::internal {
namespace {

struct VecAvx512 {
  using Reg = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;

  static Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg Set1(float x) { return _mm512_set1_ps(x); }
  static Reg Zero() { return _mm512_setzero_ps(); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg Mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg Sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg Div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Mask Less(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Reg Select(Mask m, Reg if_true, Reg if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static bool Any(Mask m) { return m != 0; }
  static float ReduceAdd(Reg x) { return _mm512_reduce_add_ps(x); }

  // e^x: x = n ln2 + r (Cody-Waite), |r| <= ln2/2, a degree-7 polynomial (Cephes
  // expf coefficients, ~1 ulp), then 2^n by vscalefps, which also rounds the
  // results below 2^-126 to subnormals and 0 correctly.
  static Reg Exp(Reg x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0F)), _mm512_set1_ps(-104.0F));
    const Reg n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341F)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375F), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4F), r);
    Reg y = _mm512_set1_ps(1.9875691500e-4F);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3F));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3F));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2F));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1F));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1F));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0F));
    return _mm512_scalef_ps(y, n);
  }

  static Reg LoadBF16(const BF16* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  // Round to nearest even (as kda::ToBF16), NaN kept a quiet NaN.
  static __m256i ToBF16Bits(Reg x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
  static void StoreBF16(BF16* p, Reg x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToBF16Bits(x)); }

  // Non-temporal stores (p aligned to the stored width) for outputs that are
  // written once and read by the next op, not by this kernel; StreamFence
  // orders them before the results are handed over.
  static void StoreStream(float* p, Reg x) { _mm512_stream_ps(p, x); }
  static void StoreStreamBF16(BF16* p, Reg x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToBF16Bits(x)); }
  static void StreamFence() { _mm_sfence(); }
};

}  // namespace
}  // namespace kda::internal

#include "kernels/kda/optimized_impl.h"

namespace kda::internal {

IsaKernels Avx512Kernels() {
  IsaKernels k;
  k.chunk_task = &RunChunkTask<VecAvx512, 2>;
  k.recurrent_task = &RunRecurrentTask<VecAvx512, 8>;
  k.column_block = 2 * VecAvx512::kLanes;
  return k;
}

}  // namespace kda::internal

#else  // not built for AVX-512

namespace kda::internal {

IsaKernels Avx512Kernels() { return {}; }

}  // namespace kda::internal

#endif
