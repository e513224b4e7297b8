// The Q8 projection kernels, compiled once per instruction set
// (kernels/isa/target.h): the small-M product (decode) that reads each weight
// byte once and dequantizes in registers (int8 -> fp32, times the block's
// fp16 scale: exact; rounded to bf16 for the bf16 pipeline), with fp32 FMA
// accumulation; and the dequantization of weight rows into fp32 or bf16
// panels for the GEMM library (prefill). Host side: kernels/gemm/q8.cc,
// linear.cc.
#include <cstdint>

#include "kda/base/bf16.h"
#include "kda/kernels/q8.h"
#include "kernels/gemm/q8_internal.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

constexpr int64_t kBlock = kQ8Block;
constexpr int kLanes = Vec::kLanes;
// A tile's accumulators, weights, scale and input must fit in the registers.
constexpr int kRegisters = kVecRegisters;
static_assert(kBlock % kLanes == 0, "a Q8 block is a whole number of registers");

// fp16 bits -> fp32 (exact; the scales are checked finite where they enter).
KDA_INLINE float HalfToFloat(uint16_t h) { return Scalar::FromBits(F16ToF32Bits(h)); }

// Blocks of scales converted at once (fp16 -> fp32).
constexpr int kScaleChunk = 16;

// n <= kScaleChunk fp16 scales as fp32 (vcvtph2ps: 16 at a time on the
// AVX-512 target, 8 on AVX2, which the CPU check requires F16C for).
KDA_INLINE void ConvertScales(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
#if KDA_TARGET == KDA_TARGET_AVX512
  if (n == kScaleChunk) {
    _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
    return;
  }
#elif KDA_TARGET == KDA_TARGET_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

// kLanes int8 values as fp32 (exact).
KDA_INLINE Vec::Reg LoadI8(const int8_t* p) {
#if KDA_TARGET == KDA_TARGET_AVX512
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif KDA_TARGET == KDA_TARGET_AVX2
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  using I8 = int8_t __attribute__((vector_size(kLanes)));
  I8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return __builtin_convertvector(v, Vec::Reg);
#endif
}

// The register's values rounded to bf16 (nearest even), as fp32. The
// dequantized weights are finite (scales and values are checked where they
// enter), so the finite form serves: five integer operations per register.
KDA_INLINE Vec::Reg RoundToBF16(Vec::Reg w) { return Vec::FromBits(BF16RoundedFiniteBits(Vec::Bits(w))); }

// Accumulates blocks [b0, b1) of output rows [n, n + R) times input rows
// [m0, m0 + MT) into acc: each weight register dequantized once and used MT
// times, each input register loaded once and used R times. The weight rows
// are short streams (K bytes each): the bytes `ahead` of the current ones are
// prefetched, one cache line per row every other block.
template <int R, int MT, bool kRoundBF16>
KDA_INLINE void TileSpan(const internal::Q8GemvArgs& a, int64_t n, int64_t m0, int64_t b0, int64_t b1, int64_t ahead,
                         Vec::Reg (&acc)[R][MT]) {
  const int64_t K = a.k;
  const int64_t nb = K / kBlock;
  const int8_t* q = a.q + n * K;
  const uint16_t* sc = a.scales + n * nb;
  const float* x = a.x + m0 * K;
  float sf[R][kScaleChunk] = {};  // filled kScaleChunk blocks at a time below
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t bc = (b - b0) % kScaleChunk;
    if (bc == 0) {
      for (int r = 0; r < R; ++r) ConvertScales(sf[r], sc + r * nb + b, b1 - b < kScaleChunk ? b1 - b : kScaleChunk);
    }
    if (((b - b0) & 1) == 0) {
      for (int r = 0; r < R; ++r) __builtin_prefetch(q + r * K + b * kBlock + ahead, 0, 3);
    }
    Vec::Reg s[R];
    for (int r = 0; r < R; ++r) s[r] = Vec::Set1(sf[r][bc]);
    for (int64_t j = 0; j < kBlock; j += kLanes) {
      const int64_t k = b * kBlock + j;
      Vec::Reg w[R];
      for (int r = 0; r < R; ++r) {
        w[r] = Vec::Mul(LoadI8(q + r * K + k), s[r]);  // fp16(d) * q: exact in fp32
        if constexpr (kRoundBF16) w[r] = RoundToBF16(w[r]);
      }
      for (int i = 0; i < MT; ++i) {
        const Vec::Reg xv = Vec::Load(x + i * K + k);
        for (int r = 0; r < R; ++r) acc[r][i] = Vec::Fma(w[r], xv, acc[r][i]);
      }
    }
  }
}

// y for output rows [n, n + R) and input rows [m0, m0 + MT): each
// accumulator's lanes summed, rounded once where the output is bf16.
template <int R, int MT>
KDA_INLINE void StoreTile(const internal::Q8GemvArgs& a, int64_t n, int64_t m0, const Vec::Reg (&acc)[R][MT]) {
  for (int i = 0; i < MT; ++i) {
    for (int r = 0; r < R; ++r) {
      const float v = Vec::ReduceAdd(acc[r][i]);
      const int64_t idx = (m0 + i) * a.n + n + r;
      if (a.y_bf16 != nullptr) {
        StoreBF16<Scalar>(a.y_bf16 + idx, v);
      } else {
        a.y_f32[idx] = v;
      }
    }
  }
}

// Output rows [n, n + R) for input rows [m0, m0 + MT), the whole K in
// registers; the next tile's rows (R * K bytes ahead) are prefetched.
template <int R, int MT, bool kRoundBF16>
KDA_INLINE void Tile(const internal::Q8GemvArgs& a, int64_t n, int64_t m0) {
  Vec::Reg acc[R][MT];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MT; ++i) acc[r][i] = Vec::Zero();
  }
  TileSpan<R, MT, kRoundBF16>(a, n, m0, 0, a.k / kBlock, R * a.k, acc);
  StoreTile<R, MT>(a, n, m0, acc);
}

// Input rows [m0, m) for output rows [n, n + R): tiles of 8, 4, 2, 1 rows (the
// weight rows stay in cache across a row's tiles).
template <int R, bool kRoundBF16>
KDA_INLINE void Rows(const internal::Q8GemvArgs& a, int64_t n, int64_t m0 = 0) {
  if constexpr (R * 8 + R + 2 <= kRegisters) {
    for (; m0 + 8 <= a.m; m0 += 8) Tile<R, 8, kRoundBF16>(a, n, m0);
  }
  for (; m0 + 4 <= a.m; m0 += 4) Tile<R, 4, kRoundBF16>(a, n, m0);
  for (; m0 + 2 <= a.m; m0 += 2) Tile<R, 2, kRoundBF16>(a, n, m0);
  for (; m0 < a.m; ++m0) Tile<R, 1, kRoundBF16>(a, n, m0);
}

// Batches of 8 or more input rows on 16-register targets, which hold one
// output row's 8 accumulators: every output row of a tile reads the 8 input
// rows in full (74 KB in fp32 at hidden 2304, from L2), which bounds the
// step. So a group of up to kGroupRows output rows is walked in spans of
// kSpanBlocks blocks, each span of the 8 input rows (8 KiB) staying in L1
// while the group's weight rows stream by; the accumulators wait in memory
// (L1) between spans. Each row's next span is prefetched, and during the
// last span the next group's first.
constexpr int kGroupRows = 8;
constexpr int64_t kSpanBlocks = 8;

template <bool kRoundBF16>
KDA_INLINE void GroupRows(const internal::Q8GemvArgs& a, int64_t n, int g) {
  const int64_t nb = a.k / kBlock;
  int64_t m0 = 0;
  for (; m0 + 8 <= a.m; m0 += 8) {
    Vec::Reg acc[kGroupRows][1][8];
    for (int r = 0; r < g; ++r) {
      for (int i = 0; i < 8; ++i) acc[r][0][i] = Vec::Zero();
    }
    for (int64_t b0 = 0; b0 < nb; b0 += kSpanBlocks) {
      const int64_t b1 = b0 + kSpanBlocks < nb ? b0 + kSpanBlocks : nb;
      const int64_t ahead = b1 < nb ? kSpanBlocks * kBlock : g * a.k - b0 * kBlock;
      for (int r = 0; r < g; ++r) TileSpan<1, 8, kRoundBF16>(a, n + r, m0, b0, b1, ahead, acc[r]);
    }
    for (int r = 0; r < g; ++r) StoreTile<1, 8>(a, n + r, m0, acc[r]);
  }
  for (int r = 0; r < g; ++r) Rows<1, kRoundBF16>(a, n + r, m0);
}

#if KDA_TARGET == KDA_TARGET_AVX512
// The AVX512-BF16 variant (bf16 pipeline): per block of 32 weights, two
// registers dequantized (exact), rounded to bf16 and packed in input order by
// one vcvtne2ps2bf16, then one vdpbf16ps per input row with its 32 bf16 inputs.
#define KDA_BF16_DOT [[gnu::always_inline, gnu::target("avx512bf16")]] inline
template <int R, int MT>
KDA_BF16_DOT void TileDot(const internal::Q8GemvArgs& a, int64_t n, int64_t m0) {
  const int64_t K = a.k;
  const int64_t nb = K / kBlock;
  __m512 acc[R][MT];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MT; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  const int8_t* q = a.q + n * K;
  const uint16_t* sc = a.scales + n * nb;
  const BF16* x = a.x_bf16 + m0 * K;
  float sf[R][kScaleChunk];
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t bc = b % kScaleChunk;
    if (bc == 0) {
      for (int r = 0; r < R; ++r) ConvertScales(sf[r], sc + r * nb + b, nb - b < kScaleChunk ? nb - b : kScaleChunk);
    }
    if ((b & 1) == 0) {  // the next tile's rows, as in TileSpan
      for (int r = 0; r < R; ++r) __builtin_prefetch(q + (R + r) * K + b * kBlock, 0, 3);
    }
    const int64_t k = b * kBlock;
    __m512bh w[R];
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(sf[r][bc]);
      const __m512 lo = _mm512_mul_ps(LoadI8(q + r * K + k), s);
      const __m512 hi = _mm512_mul_ps(LoadI8(q + r * K + k + 16), s);
      w[r] = _mm512_cvtne2ps_pbh(hi, lo);  // lo -> elements 0..15, hi -> 16..31
    }
    for (int i = 0; i < MT; ++i) {
      const auto xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i * K + k));
      for (int r = 0; r < R; ++r) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], w[r], xv);
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int r = 0; r < R; ++r) {
      const float v = _mm512_reduce_add_ps(acc[r][i]);
      const int64_t idx = (m0 + i) * a.n + n + r;
      if (a.y_bf16 != nullptr) {
        StoreBF16<Scalar>(a.y_bf16 + idx, v);
      } else {
        a.y_f32[idx] = v;
      }
    }
  }
}

template <int R>
KDA_BF16_DOT void RowsDot(const internal::Q8GemvArgs& a, int64_t n) {
  int64_t m0 = 0;
  if constexpr (R <= 2) {
    for (; m0 + 8 <= a.m; m0 += 8) TileDot<R, 8>(a, n, m0);
  }
  for (; m0 + 4 <= a.m; m0 += 4) TileDot<R, 4>(a, n, m0);
  for (; m0 + 2 <= a.m; m0 += 2) TileDot<R, 2>(a, n, m0);
  for (; m0 < a.m; ++m0) TileDot<R, 1>(a, n, m0);
}

[[gnu::target("avx512bf16")]] void GemvRangeDot(const internal::Q8GemvArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (a.m <= 4) {
    for (; n + 4 <= n1; n += 4) RowsDot<4>(a, n);
  } else {
    for (; n + 2 <= n1; n += 2) RowsDot<2>(a, n);
  }
  for (; n < n1; ++n) RowsDot<1>(a, n);
}
#undef KDA_BF16_DOT
#endif

template <bool kRoundBF16>
void GemvRange(const internal::Q8GemvArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (a.m <= 4) {
    for (; n + 4 <= n1; n += 4) Rows<4, kRoundBF16>(a, n);
  } else if constexpr (kRegisters >= 32) {
    for (; n + 2 <= n1; n += 2) Rows<2, kRoundBF16>(a, n);
  } else {
    for (; n < n1; n += kGroupRows)
      GroupRows<kRoundBF16>(a, n, n1 - n < kGroupRows ? static_cast<int>(n1 - n) : kGroupRows);
  }
  for (; n < n1; ++n) Rows<1, kRoundBF16>(a, n);
}

template <class T, bool kRoundBF16>
KDA_INLINE void DequantRows(T* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0, int64_t r1) {
  const int64_t nb = K / kBlock;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const Vec::Reg s = Vec::Set1(HalfToFloat(scales[r * nb + b]));  // once per 32 weights written
      for (int64_t j = 0; j < kBlock; j += kLanes) {
        const int64_t i = r * K + b * kBlock + j;
        Vec::Reg v = Vec::Mul(LoadI8(q + i), s);
        if constexpr (sizeof(T) == sizeof(BF16)) {
          StoreBF16<Vec>(w + i, v);
        } else {
          if constexpr (kRoundBF16) v = RoundToBF16(v);
          Vec::Store(w + i, v);
        }
      }
    }
  }
}

}  // namespace

void Q8Gemv(const internal::Q8GemvArgs& a, int64_t n0, int64_t n1) {
#if KDA_TARGET == KDA_TARGET_AVX512
  if (a.bf16_dot) {
    GemvRangeDot(a, n0, n1);
    return;
  }
#endif
  if (a.round_bf16) {
    GemvRange<true>(a, n0, n1);
  } else {
    GemvRange<false>(a, n0, n1);
  }
}

void Q8DequantF32(float* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0, int64_t r1,
                  bool round_bf16) {
  if (round_bf16) {
    DequantRows<float, true>(w, q, scales, K, r0, r1);
  } else {
    DequantRows<float, false>(w, q, scales, K, r0, r1);
  }
}

void Q8DequantBF16(BF16* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0, int64_t r1) {
  DequantRows<BF16, true>(w, q, scales, K, r0, r1);
}

}  // namespace kda::KDA_TARGET_NS
