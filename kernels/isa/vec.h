// The vector layer of the per-ISA kernels: the traits of the target's vector
// (Vec) and of one lane (Scalar, for loops that GCC vectorises under
// `#pragma omp simd`), and the primitives written once over them: e^x,
// sigmoid, SiLU, bf16 and fp16 loads and round-to-nearest-even stores, and (one lane)
// log and softplus. Include only from per-ISA sources (kernels/isa/target.h).
//
// Traits provide: Reg, Mask, U32 / I32 (the register's bits as unsigned /
// signed lanes), U16 (kLanes 16-bit lanes), kLanes; Load, Store, Set1, Zero, Add, Sub, Mul, Div,
// Fma(a, b, c) = a*b + c (fused where the target has FMA), Fnma(a, b, c) =
// c - a*b, Min(a, b) = a < b ? a : b, Max(a, b) = a > b ? a : b (so that
// Min(constant, NaN) is NaN), Round (to nearest even), Less, Select(mask,
// if_true, if_false), Any, ReduceAdd, Bits / FromBits, Transpose (kLanes registers
// as a kLanes x kLanes square: r[i] lane j <-> r[j] lane i). HalfVec is a vector of
// half Vec's lanes where the target has one whose operations cost less (the
// AVX-512 target's 256-bit registers; its avx512_shape stand-in's 8 lanes), else
// Vec itself. On the AVX-512 target (and its avx512_shape stand-in) VecStream
// has Store, StoreBF16 (non-temporal stores of one Vec register to an address
// aligned to its width) and Fence.
#pragma once

#include <cstdint>

#include "kda/base/bf16.h"
#include "kda/base/f16.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target.h"

#if KDA_TARGET != KDA_TARGET_GENERIC
// g++ 12 warns about the intentionally undefined source operands in its own
// AVX-512 headers (GCC bug 105593); the pragma covers only those headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a g++ warning group that clang does not know
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

// Functions of the per-ISA namespaces are forced inline into their callers.
#define KDA_INLINE [[gnu::always_inline]] inline

namespace kda::KDA_TARGET_NS {

// ------------------------------------------------------------------ one lane

// One float: the element-wise kernels' loops are written over it and
// vectorised by the compiler for the target (branch-free: selects, no calls).
struct Scalar {
  using Reg = float;
  using Mask = bool;
  using U32 = uint32_t;
  using I32 = int32_t;
  using U16 = uint16_t;
  static constexpr int kLanes = 1;

  KDA_INLINE static Reg Load(const float* p) { return *p; }
  KDA_INLINE static void Store(float* p, Reg x) { *p = x; }
  KDA_INLINE static Reg Set1(float x) { return x; }
  KDA_INLINE static Reg Zero() { return 0.0F; }
  KDA_INLINE static Reg Add(Reg a, Reg b) { return a + b; }
  KDA_INLINE static Reg Sub(Reg a, Reg b) { return a - b; }
  KDA_INLINE static Reg Mul(Reg a, Reg b) { return a * b; }
  KDA_INLINE static Reg Div(Reg a, Reg b) { return a / b; }
#if defined(__FMA__)
  KDA_INLINE static Reg Fma(Reg a, Reg b, Reg c) { return __builtin_fmaf(a, b, c); }
  KDA_INLINE static Reg Fnma(Reg a, Reg b, Reg c) { return __builtin_fmaf(-a, b, c); }
#else
  KDA_INLINE static Reg Fma(Reg a, Reg b, Reg c) { return a * b + c; }
  KDA_INLINE static Reg Fnma(Reg a, Reg b, Reg c) { return c - a * b; }
#endif
  KDA_INLINE static Reg Min(Reg a, Reg b) { return a < b ? a : b; }
  KDA_INLINE static Reg Max(Reg a, Reg b) { return a > b ? a : b; }
  // Adding and subtracting 1.5 * 2^23 rounds |x| < 2^22 to nearest even (and vectorises on every target).
  KDA_INLINE static Reg Round(Reg x) {
    constexpr float kRound = 12582912.0F;
    return (x + kRound) - kRound;
  }
  KDA_INLINE static Mask Less(Reg a, Reg b) { return a < b; }
  KDA_INLINE static Reg Select(Mask m, Reg if_true, Reg if_false) { return m ? if_true : if_false; }
  KDA_INLINE static bool Any(Mask m) { return m; }
  KDA_INLINE static float ReduceAdd(Reg x) { return x; }
  KDA_INLINE static void Transpose(Reg (&/*r*/)[1]) {}
  KDA_INLINE static U32 Bits(Reg x) {
    U32 u = 0;
    __builtin_memcpy(&u, &x, sizeof(u));
    return u;
  }
  KDA_INLINE static Reg FromBits(U32 u) {
    Reg x = 0.0F;
    __builtin_memcpy(&x, &u, sizeof(x));
    return x;
  }
};

// ------------------------------------------------------------ target vector

#if KDA_TARGET == KDA_TARGET_AVX512

// Zen 4 runs a 512-bit FMA as two 256-bit halves, so the gain over AVX2 there
// comes from halving the instruction count (loads, broadcasts, stores) per
// FMA, not from the FMA rate.
struct Vec {
  using Reg = __m512;
  using Mask = __mmask16;
  using U32 = uint32_t __attribute__((vector_size(64)));
  using I32 = int32_t __attribute__((vector_size(64)));
  using U16 = uint16_t __attribute__((vector_size(32)));
  static constexpr int kLanes = 16;

  KDA_INLINE static Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  KDA_INLINE static void Store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  KDA_INLINE static Reg Set1(float x) { return _mm512_set1_ps(x); }
  KDA_INLINE static Reg Zero() { return _mm512_setzero_ps(); }
  KDA_INLINE static Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  KDA_INLINE static Reg Sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  KDA_INLINE static Reg Mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  KDA_INLINE static Reg Div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  KDA_INLINE static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  KDA_INLINE static Reg Fnma(Reg a, Reg b, Reg c) { return _mm512_fnmadd_ps(a, b, c); }
  KDA_INLINE static Reg Min(Reg a, Reg b) { return _mm512_min_ps(a, b); }
  KDA_INLINE static Reg Max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  KDA_INLINE static Reg Round(Reg x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  KDA_INLINE static Mask Less(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  KDA_INLINE static Reg Select(Mask m, Reg if_true, Reg if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  KDA_INLINE static bool Any(Mask m) { return m != 0; }
  KDA_INLINE static float ReduceAdd(Reg x) { return _mm512_reduce_add_ps(x); }
  KDA_INLINE static U32 Bits(Reg x) { return reinterpret_cast<U32>(x); }
  KDA_INLINE static Reg FromBits(U32 u) { return reinterpret_cast<Reg>(u); }
  KDA_INLINE static void Transpose(Reg (&r)[16]) {
    Reg s[16];
    for (int i = 0; i < 16; i += 2) {
      s[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      s[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(s[i], s[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(s[i], s[i + 2], 0xEE);
      r[i + 2] = _mm512_shuffle_ps(s[i + 1], s[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(s[i + 1], s[i + 3], 0xEE);
    }
    // Rows now hold 4 x 4 blocks transposed within each 128-bit lane; the
    // lanes are exchanged between rows 4 apart, then 8 apart.
    for (int i = 0; i < 4; ++i) {
      s[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
      s[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
      s[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
      s[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm512_shuffle_f32x4(s[i], s[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_f32x4(s[i], s[i + 8], 0xDD);
      r[i + 4] = _mm512_shuffle_f32x4(s[i + 4], s[i + 12], 0x88);
      r[i + 12] = _mm512_shuffle_f32x4(s[i + 4], s[i + 12], 0xDD);
    }
  }
};

#endif

#if KDA_TARGET == KDA_TARGET_AVX2 || KDA_TARGET == KDA_TARGET_AVX512

// A 256-bit register: the AVX2 target's vector, the AVX-512 target's half one.
struct Vec256 {
  using Reg = __m256;
  using Mask = __m256;
  using U32 = uint32_t __attribute__((vector_size(32)));
  using I32 = int32_t __attribute__((vector_size(32)));
  using U16 = uint16_t __attribute__((vector_size(16)));
  static constexpr int kLanes = 8;

  KDA_INLINE static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  KDA_INLINE static void Store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  KDA_INLINE static Reg Set1(float x) { return _mm256_set1_ps(x); }
  KDA_INLINE static Reg Zero() { return _mm256_setzero_ps(); }
  KDA_INLINE static Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  KDA_INLINE static Reg Sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  KDA_INLINE static Reg Mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  KDA_INLINE static Reg Div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  KDA_INLINE static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  KDA_INLINE static Reg Fnma(Reg a, Reg b, Reg c) { return _mm256_fnmadd_ps(a, b, c); }
  KDA_INLINE static Reg Min(Reg a, Reg b) { return _mm256_min_ps(a, b); }
  KDA_INLINE static Reg Max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  KDA_INLINE static Reg Round(Reg x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  KDA_INLINE static Mask Less(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  KDA_INLINE static Reg Select(Mask m, Reg if_true, Reg if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  KDA_INLINE static bool Any(Mask m) { return _mm256_movemask_ps(m) != 0; }
  KDA_INLINE static float ReduceAdd(Reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  KDA_INLINE static U32 Bits(Reg x) { return reinterpret_cast<U32>(x); }
  KDA_INLINE static Reg FromBits(U32 u) { return reinterpret_cast<Reg>(u); }
  KDA_INLINE static void Transpose(Reg (&r)[8]) {
    Reg s[8];
    for (int i = 0; i < 8; i += 2) {
      s[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      s[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    Reg t[8];
    for (int i = 0; i < 8; i += 4) {
      t[i] = _mm256_shuffle_ps(s[i], s[i + 2], 0x44);
      t[i + 1] = _mm256_shuffle_ps(s[i], s[i + 2], 0xEE);
      t[i + 2] = _mm256_shuffle_ps(s[i + 1], s[i + 3], 0x44);
      t[i + 3] = _mm256_shuffle_ps(s[i + 1], s[i + 3], 0xEE);
    }
    // Each 128-bit half now holds a 4 x 4 block transposed; the halves are exchanged between rows 4 apart.
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm256_permute2f128_ps(t[i], t[i + 4], 0x20);
      r[i + 4] = _mm256_permute2f128_ps(t[i], t[i + 4], 0x31);
    }
  }
};

#if KDA_TARGET == KDA_TARGET_AVX2
using Vec = Vec256;
using HalfVec = Vec;
#else
// Zen 4 runs a 256-bit operation at half the cost of a 512-bit one.
using HalfVec = Vec256;
#endif

#else  // generic, avx512_shape

// GCC/Clang vector extensions of L lanes: portable, lowered to the target's
// SIMD. The generic target: 4 lanes (an SSE2 register on x86-64),
// multiply-add as two roundings (no FMA instruction assumed). The avx512_shape
// test target: the AVX-512 target's 16 lanes (its half vector: 8), lowered to
// 256-bit halves of AVX2, with fused multiply-add as there.
// (The lane types are spelled per lane count: GCC 12 cannot take a vector_size
// that depends on a template parameter.)
template <int L>
struct VecExtTypes;
template <>
struct VecExtTypes<4> {
  using F32 = float __attribute__((vector_size(16)));
  using I32 = int32_t __attribute__((vector_size(16)));
  using U32 = uint32_t __attribute__((vector_size(16)));
  using U16 = uint16_t __attribute__((vector_size(8)));
};
template <>
struct VecExtTypes<8> {
  using F32 = float __attribute__((vector_size(32)));
  using I32 = int32_t __attribute__((vector_size(32)));
  using U32 = uint32_t __attribute__((vector_size(32)));
  using U16 = uint16_t __attribute__((vector_size(16)));
};
template <>
struct VecExtTypes<16> {
  using F32 = float __attribute__((vector_size(64)));
  using I32 = int32_t __attribute__((vector_size(64)));
  using U32 = uint32_t __attribute__((vector_size(64)));
  using U16 = uint16_t __attribute__((vector_size(32)));
};

template <int L>
struct VecExt {
  static constexpr int kLanes = L;
  using Reg = typename VecExtTypes<L>::F32;
  using Mask = typename VecExtTypes<L>::I32;  // -1 where true
  using U32 = typename VecExtTypes<L>::U32;
  using I32 = typename VecExtTypes<L>::I32;
  using U16 = typename VecExtTypes<L>::U16;

  KDA_INLINE static Reg Load(const float* p) {
    Reg r;
    __builtin_memcpy(&r, p, sizeof(r));
    return r;
  }
  KDA_INLINE static void Store(float* p, Reg x) { __builtin_memcpy(p, &x, sizeof(x)); }
  KDA_INLINE static Reg Set1(float x) { return Reg{} + x; }
  KDA_INLINE static Reg Zero() { return Reg{}; }
  KDA_INLINE static Reg Add(Reg a, Reg b) { return a + b; }
  KDA_INLINE static Reg Sub(Reg a, Reg b) { return a - b; }
  KDA_INLINE static Reg Mul(Reg a, Reg b) { return a * b; }
  KDA_INLINE static Reg Div(Reg a, Reg b) { return a / b; }
#if KDA_TARGET == KDA_TARGET_AVX512_SHAPE
  KDA_INLINE static Reg Fma(Reg a, Reg b, Reg c) {
    __m256 h[3][L / 8];
    __builtin_memcpy(h[0], &a, sizeof(a));
    __builtin_memcpy(h[1], &b, sizeof(b));
    __builtin_memcpy(h[2], &c, sizeof(c));
    for (int i = 0; i < L / 8; ++i) h[2][i] = _mm256_fmadd_ps(h[0][i], h[1][i], h[2][i]);
    __builtin_memcpy(&c, h[2], sizeof(c));
    return c;
  }
  KDA_INLINE static Reg Fnma(Reg a, Reg b, Reg c) { return Fma(-a, b, c); }
#else
  KDA_INLINE static Reg Fma(Reg a, Reg b, Reg c) { return a * b + c; }
  KDA_INLINE static Reg Fnma(Reg a, Reg b, Reg c) { return c - a * b; }
#endif
  KDA_INLINE static Reg Min(Reg a, Reg b) { return a < b ? a : b; }
  KDA_INLINE static Reg Max(Reg a, Reg b) { return a > b ? a : b; }
  KDA_INLINE static Reg Round(Reg x) {
    constexpr float kRound = 12582912.0F;  // see Scalar::Round
    return (x + kRound) - kRound;
  }
  KDA_INLINE static Mask Less(Reg a, Reg b) { return a < b; }
  KDA_INLINE static Reg Select(Mask m, Reg if_true, Reg if_false) { return m ? if_true : if_false; }
  KDA_INLINE static bool Any(Mask m) {
    bool any = false;
    for (int i = 0; i < kLanes; ++i) any = any || m[i] != 0;
    return any;
  }
  KDA_INLINE static float ReduceAdd(Reg x) {
    float s = 0.0F;
    for (int i = 0; i < kLanes; ++i) s += x[i];
    return s;
  }
  KDA_INLINE static void Transpose(Reg (&r)[L]) {
    for (int i = 0; i < L; ++i) {
      for (int j = i + 1; j < L; ++j) {
        const float x = r[i][j];
        r[i][j] = r[j][i];
        r[j][i] = x;
      }
    }
  }
  KDA_INLINE static U32 Bits(Reg x) { return reinterpret_cast<U32>(x); }
  KDA_INLINE static Reg FromBits(U32 u) { return reinterpret_cast<Reg>(u); }
};

#if KDA_TARGET == KDA_TARGET_AVX512_SHAPE
using Vec = VecExt<16>;
using HalfVec = VecExt<8>;
#else
using Vec = VecExt<4>;
using HalfVec = Vec;
#endif

#endif

// ---------------------------------------------------------------- primitives

// 2^n for integral n in [-126, 127], from the exponent bits.
template <class Vt>
KDA_INLINE typename Vt::Reg Pow2(typename Vt::Reg n) {
  if constexpr (Vt::kLanes == 1) {
    return Vt::FromBits(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  } else {
    return Vt::FromBits(reinterpret_cast<typename Vt::U32>((__builtin_convertvector(n, typename Vt::I32) + 127) << 23));
  }
}

// e^x: x = n ln2 + r (Cody-Waite), |r| <= ln2/2, a degree-7 polynomial
// (Cephes expf coefficients, ~1 ulp), 2^n from the exponent bits. Clamped to
// [kExpMin, kExpMax]; 0 below kExpMin (the libm result there is subnormal or
// 0); NaN stays NaN.
template <class Vt>
KDA_INLINE typename Vt::Reg Exp(typename Vt::Reg x) {
  using Reg = typename Vt::Reg;
  const typename Vt::Mask tiny = Vt::Less(x, Vt::Set1(kc::kExpMin));
  x = Vt::Max(Vt::Set1(kc::kExpMin), Vt::Min(Vt::Set1(kc::kExpMax), x));
  const Reg n = Vt::Round(Vt::Mul(x, Vt::Set1(kc::kLog2E)));
  Reg r = Vt::Fnma(n, Vt::Set1(kc::kLn2Hi), x);
  r = Vt::Fnma(n, Vt::Set1(kc::kLn2Lo), r);
  Reg y = Vt::Set1(1.9875691500e-4F);
  y = Vt::Fma(y, r, Vt::Set1(1.3981999507e-3F));
  y = Vt::Fma(y, r, Vt::Set1(8.3334519073e-3F));
  y = Vt::Fma(y, r, Vt::Set1(4.1665795894e-2F));
  y = Vt::Fma(y, r, Vt::Set1(1.6666665459e-1F));
  y = Vt::Fma(y, r, Vt::Set1(5.0000001201e-1F));
  y = Vt::Fma(y, Vt::Mul(r, r), r);
  y = Vt::Add(y, Vt::Set1(1.0F));
  return Vt::Select(tiny, Vt::Zero(), Vt::Mul(y, Pow2<Vt>(n)));
}

// 1 / (1 + e^-x).
template <class Vt>
KDA_INLINE typename Vt::Reg Sigmoid(typename Vt::Reg x) {
  const typename Vt::Reg one = Vt::Set1(1.0F);
  return Vt::Div(one, Vt::Add(one, Exp<Vt>(Vt::Sub(Vt::Zero(), x))));
}

// x / (1 + e^-x).
template <class Vt>
KDA_INLINE typename Vt::Reg Silu(typename Vt::Reg x) {
  return Vt::Div(x, Vt::Add(Vt::Set1(1.0F), Exp<Vt>(Vt::Sub(Vt::Zero(), x))));
}

// log(x) for normal x > 0 (one lane): x = m 2^e with m in [sqrt(1/2),
// sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716; within
// 2 ulp.
KDA_INLINE float Log(float x) {
  const uint32_t u = Scalar::Bits(x);
  int32_t e = static_cast<int32_t>(u >> 23) - 127;
  float m = Scalar::FromBits((u & 0x007fffffU) | 0x3f800000U);  // [1, 2)
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

// log(1 + e^x) (one lane), = x above kSoftplusThreshold (the reference's
// threshold). Below: max(x, 0) + log1p(e^{-|x|}), with log1p(y) = log(1 + y) *
// y / ((1 + y) - 1) to keep the digits of small y.
KDA_INLINE float Softplus(float x) {
  const float y = Exp<Scalar>(x < 0.0F ? x : -x);
  const float u = 1.0F + y;
  const float d = u - 1.0F;
  const float l1p = d == 0.0F ? y : Log(u) * (y / d);
  const float sp = (x > 0.0F ? x : 0.0F) + l1p;
  return x > kc::kSoftplusThreshold ? x : sp;
}

// ---------------------------------------------------------------- bf16

// kLanes bf16 values as fp32 (exact). On the x86 targets one vpmovzxwd and a
// shift: g++ 12 lowers the generic widening below to two half-width
// extensions and an insert, four shuffles per register, which bounded the
// bf16 small-M products (docs/projections.md).
template <class Vt>
KDA_INLINE typename Vt::Reg LoadBF16(const BF16* p) {
  if constexpr (Vt::kLanes == 1) {
    return Vt::FromBits(static_cast<uint32_t>(p->bits) << 16);
  } else {
#if KDA_TARGET == KDA_TARGET_AVX512 || KDA_TARGET == KDA_TARGET_AVX2
    if constexpr (Vt::kLanes == 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
#else
    typename Vt::U16 h;
    __builtin_memcpy(&h, p, sizeof(h));
    return Vt::FromBits(__builtin_convertvector(h, typename Vt::U32) << 16);
#endif
  }
}

// The bf16 bits of x, rounded to nearest even (kda::BF16RoundedBits).
template <class Vt>
KDA_INLINE typename Vt::U16 BF16Bits(typename Vt::Reg x) {
  if constexpr (Vt::kLanes == 1) {
    return static_cast<uint16_t>(BF16RoundedBits(Vt::Bits(x)));
  } else {
    return __builtin_convertvector(BF16RoundedBits(Vt::Bits(x)), typename Vt::U16);
  }
}

template <class Vt>
KDA_INLINE void StoreBF16(BF16* p, typename Vt::Reg x) {
  if constexpr (Vt::kLanes == 1) {
    p->bits = BF16Bits<Vt>(x);
  } else {
    const typename Vt::U16 h = BF16Bits<Vt>(x);
    __builtin_memcpy(static_cast<void*>(p), &h, sizeof(h));
  }
}

// ---------------------------------------------------------------- fp16

// kLanes fp16 values as fp32 (exact): vcvtph2ps where the target has F16C
// (every AVX2 CPU the dispatcher accepts), the bit conversion of f16.h per lane
// elsewhere.
template <class Vt>
KDA_INLINE typename Vt::Reg LoadF16(const F16* p) {
  if constexpr (Vt::kLanes == 1) {
    return Vt::FromBits(F16ToF32Bits(p->bits));
  } else {
#if KDA_TARGET == KDA_TARGET_AVX512 || KDA_TARGET == KDA_TARGET_AVX2
    if constexpr (Vt::kLanes == 16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    } else {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
#elif KDA_TARGET == KDA_TARGET_AVX512_SHAPE
    __m256 h[Vt::kLanes / 8];
    for (int i = 0; i < Vt::kLanes / 8; ++i) {
      h[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * i)));
    }
    typename Vt::Reg r;
    __builtin_memcpy(&r, h, sizeof(r));
    return r;
#else
    typename Vt::U32 u;
    for (int i = 0; i < Vt::kLanes; ++i) u[i] = F16ToF32Bits(p[i].bits);
    return Vt::FromBits(u);
#endif
  }
}

// Stores x as fp16, rounded to nearest even.
template <class Vt>
KDA_INLINE void StoreF16(F16* p, typename Vt::Reg x) {
  if constexpr (Vt::kLanes == 1) {
    p->bits = F32ToF16Bits(Vt::Bits(x));
  } else {
#if KDA_TARGET == KDA_TARGET_AVX512 || KDA_TARGET == KDA_TARGET_AVX2
    if constexpr (Vt::kLanes == 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
#elif KDA_TARGET == KDA_TARGET_AVX512_SHAPE
    __m256 h[Vt::kLanes / 8];
    __builtin_memcpy(h, &x, sizeof(x));
    for (int i = 0; i < Vt::kLanes / 8; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8 * i), _mm256_cvtps_ph(h[i], _MM_FROUND_TO_NEAREST_INT));
    }
#else
    const typename Vt::U32 u = Vt::Bits(x);
    for (int i = 0; i < Vt::kLanes; ++i) p[i].bits = F32ToF16Bits(u[i]);
#endif
  }
}

#if KDA_TARGET == KDA_TARGET_AVX512
// Non-temporal stores (p aligned to the stored width) for outputs that are
// written once and read by the next op, not by this kernel; StreamFence orders
// them before the results are handed over.
struct VecStream {
  KDA_INLINE static void Store(float* p, Vec::Reg x) { _mm512_stream_ps(p, x); }
  KDA_INLINE static void StoreBF16(BF16* p, Vec::Reg x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(BF16Bits<Vec>(x)));
  }
  KDA_INLINE static void StoreF16(F16* p, Vec::Reg x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  KDA_INLINE static void Fence() { _mm_sfence(); }
};
#define KDA_HAS_STREAM_STORES 1
#elif KDA_TARGET == KDA_TARGET_AVX512_SHAPE
// The AVX-512 target's streaming stores as plain stores, which trap where
// those would fault: on an address not aligned to the stored width.
struct VecStream {
  KDA_INLINE static void Store(float* p, Vec::Reg x) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(Vec::Reg) != 0) __builtin_trap();
    Vec::Store(p, x);
  }
  KDA_INLINE static void StoreBF16(BF16* p, Vec::Reg x) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(Vec::U16) != 0) __builtin_trap();
    KDA_TARGET_NS::StoreBF16<Vec>(p, x);
  }
  KDA_INLINE static void StoreF16(F16* p, Vec::Reg x) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(Vec::U16) != 0) __builtin_trap();
    KDA_TARGET_NS::StoreF16<Vec>(p, x);
  }
  KDA_INLINE static void Fence() {}
};
#define KDA_HAS_STREAM_STORES 1
#else
#define KDA_HAS_STREAM_STORES 0
#endif

// Scalar loads and stores of F32 or BF16 elements, for the one-lane loops.
KDA_INLINE float LoadF(float v) { return v; }
KDA_INLINE float LoadF(BF16 v) { return LoadBF16<Scalar>(&v); }
KDA_INLINE void StoreF(float* dst, float v) { *dst = v; }
KDA_INLINE void StoreF(BF16* dst, float v) { StoreBF16<Scalar>(dst, v); }

}  // namespace kda::KDA_TARGET_NS
