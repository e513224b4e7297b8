// The projection kernels, compiled once per instruction set
// (kernels/isa/target.h): the small-M product (decode) that reads each weight
// byte once, widening or dequantizing it in registers (bf16 -> fp32 and
// int8 -> fp32 times the block's fp16 scale: exact; the Q8 weights rounded to
// bf16 for the bf16 pipeline), with fp32 FMA accumulation or, on AVX512-BF16,
// vdpbf16ps; and the dequantization of Q8 weight rows into fp32 or bf16 panels
// for the GEMM library (prefill). Host side: kernels/gemm/linear.cc.
#include <cstdint>

#include "kda/base/bf16.h"
#include "kda/kernels/q8.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/gemm/q8_block.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

using internal::GemvArgs;
using internal::GemvWeights;

constexpr int64_t kBlock = internal::kGemvBlock;
static_assert(kBlock == kQ8Block, "the small-M kernels walk Q8 blocks");
constexpr int kLanes = Vec::kLanes;
// A tile's accumulators, weights, scale and input must fit in the registers.
constexpr int kRegisters = kVecRegisters;
static_assert(kBlock % kLanes == 0, "a block is a whole number of registers");
constexpr int64_t kCacheLine = 64;

// fp16 bits -> fp32 (exact; the scales are checked finite where they enter).
KDA_INLINE float HalfToFloat(uint16_t h) { return Scalar::FromBits(F16ToF32Bits(h)); }

// Blocks of scales converted at once (fp16 -> fp32).
constexpr int kScaleChunk = 16;

// n <= kScaleChunk fp16 scales as fp32 with vcvtph2ps (the CPU check
// requires F16C): a full chunk at once on the AVX-512 target, otherwise 8 at
// a time, the last fewer than 8 one by one.
KDA_INLINE void ConvertScales(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
#if KDA_TARGET == KDA_TARGET_AVX512
  if (n == kScaleChunk) {
    _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
    return;
  }
#endif
#if KDA_TARGET == KDA_TARGET_AVX512 || KDA_TARGET == KDA_TARGET_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

// x = d * q (exact: at most 18 significant bits) rounded to bf16, in three
// floating-point operations (Veltkamp's splitting at 8 significant bits):
// c = x * (2^16 + 1) rounded once (x * 2^16 + x, one FMA), then c - (c - x)
// is x rounded to 8 bits. For every finite fp16 d >= 0 and q in [-127, 127]
// (the Q8 domain, checked where the weights enter) it equals
// bf16(d * q) (nearest even) bit for bit: checked exhaustively by the Linear
// tests. The integer form (BF16RoundedFiniteBits) takes five operations and
// measured slower in the small-M kernels (docs/projections.md).
KDA_INLINE Vec::Reg SplitToBF16(Vec::Reg x) {
  const Vec::Reg c = Vec::Fma(x, Vec::Set1(65536.0F), x);
  return Vec::Sub(c, Vec::Sub(c, x));
}

#if KDA_TARGET == KDA_TARGET_AVX512
// Functions that use vdpbf16ps (AVX512-BF16, beyond the target's -m flags).
#define KDA_BF16_DOT [[gnu::always_inline, gnu::target("avx512bf16")]] inline
#endif

// The weight rows of a tile: R rows from output row n, walked a block
// (kBlock weights) at a time over blocks [b0, b1). Block(b) readies block b
// (the Q8 scales), Load(r, b, j) gives lanes [j, j + kLanes) of row r's block
// b in fp32 (exact), and Row(r) the row's bytes (for prefetching).
template <int R, bool kRoundBF16>
struct Q8Rows {
  static constexpr int64_t kBlockBytes = kBlock;
  static constexpr bool kDequantizes = true;
  const int8_t* q;
  const uint16_t* sc;
  int64_t k;
  int64_t nb;
  int64_t b0;
  int64_t b1;
  // The scales of kScaleChunk blocks as fp32, converted a chunk at a time
  // by Block, each broadcast from memory where it is used (a register per
  // row held across the block spills under the 8-row tiles' accumulators).
  alignas(64) float sf[R][kScaleChunk] = {};
  int64_t bc = 0;  // the current block's place in sf

  KDA_INLINE Q8Rows(const GemvArgs& a, int64_t n, int64_t first, int64_t last)
      : q(a.q + n * a.k), sc(a.scales + n * (a.k / kBlock)), k(a.k), nb(a.k / kBlock), b0(first), b1(last) {}
  KDA_INLINE void Block(int64_t b) {
    bc = (b - b0) % kScaleChunk;
    if (bc == 0) {
      for (int r = 0; r < R; ++r) ConvertScales(sf[r], sc + r * nb + b, b1 - b < kScaleChunk ? b1 - b : kScaleChunk);
    }
  }
  KDA_INLINE Vec::Reg Scale(int r) const { return Vec::Set1(sf[r][bc]); }
  KDA_INLINE Vec::Reg Load(int r, int64_t b, int64_t j) const {
    Vec::Reg w = Vec::Mul(LoadI8(q + r * k + b * kBlock + j), Scale(r));  // fp16(d) * q: exact in fp32
    if constexpr (kRoundBF16) w = SplitToBF16(w);
    return w;
  }
  KDA_INLINE const char* Row(int r) const { return reinterpret_cast<const char*>(q + r * k); }
#if KDA_TARGET == KDA_TARGET_AVX512
  // Block b of row r as 32 bf16 in input order.
  KDA_BF16_DOT __m512bh LoadDot(int r, int64_t b) const { return Q8BlockBF16(q + r * k + b * kBlock, Scale(r)); }
#endif
};

template <int R>
using Q8ExactRows = Q8Rows<R, false>;
template <int R>
using Q8Bf16Rows = Q8Rows<R, true>;

// Dense fp32 or bf16 weight rows (bf16 widened to fp32: exact).
template <int R, class T>
struct DenseRows {
  static constexpr int64_t kBlockBytes = kBlock * static_cast<int64_t>(sizeof(T));
  static constexpr bool kDequantizes = false;
  const T* w;
  int64_t k;

  KDA_INLINE DenseRows(const GemvArgs& a, int64_t n, int64_t /*first*/, int64_t /*last*/)
      : w(Weights(a) + n * a.k), k(a.k) {}
  KDA_INLINE static const T* Weights(const GemvArgs& a) {
    if constexpr (sizeof(T) == sizeof(float)) {
      return a.w_f32;
    } else {
      return a.w_bf16;
    }
  }
  KDA_INLINE void Block(int64_t /*b*/) {}
  KDA_INLINE Vec::Reg Load(int r, int64_t b, int64_t j) const {
    if constexpr (sizeof(T) == sizeof(float)) {
      return Vec::Load(w + r * k + b * kBlock + j);
    } else {
      return LoadBF16<Vec>(w + r * k + b * kBlock + j);
    }
  }
  KDA_INLINE const char* Row(int r) const { return reinterpret_cast<const char*>(w + r * k); }
#if KDA_TARGET == KDA_TARGET_AVX512
  KDA_BF16_DOT __m512bh LoadDot(int r, int64_t b) const {
    static_assert(sizeof(T) == sizeof(BF16), "the bf16 dot takes bf16 weights");
    return reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + r * k + b * kBlock));
  }
#endif
};

template <int R>
using F32Rows = DenseRows<R, float>;
template <int R>
using Bf16Rows = DenseRows<R, BF16>;

// Prefetches the cache lines of block b of each row, `ahead` bytes on: the
// weight rows are short streams (k weights each), which the hardware
// prefetcher alone follows late. A tile ahead (9-33 KB of rows) goes to L2
// (prefetcht1): into L1 it evicts what the current tile still reads (the
// layer's batch-1 decode step 13-20% faster on a Zen 4, bf16 and int8:
// docs/projections.md); a span ahead (GroupRows, under 1 KB) goes to L1.
constexpr int kPrefetchL2 = 2;  // __builtin_prefetch locality: prefetcht1
constexpr int kPrefetchL1 = 3;  // prefetcht0
template <int R, int kLocality, class W>
KDA_INLINE void PrefetchBlock(const W& rows, int64_t b, int64_t ahead) {
  for (int64_t off = 0; off < W::kBlockBytes; off += kCacheLine) {
    if ((b * W::kBlockBytes + off) % kCacheLine != 0) continue;  // Q8: one line per two blocks
    for (int r = 0; r < R; ++r) __builtin_prefetch(rows.Row(r) + b * W::kBlockBytes + off + ahead, 0, kLocality);
  }
}

// Accumulates blocks [b0, b1) of output rows [n, n + R) times input rows
// [m0, m0 + MT) into acc: each weight register loaded (and widened or
// dequantized) once and used MT times, each input register loaded once and
// used R times. The blocks `ahead` of the current ones are prefetched (to
// the cache level kLocality names). Q8 weights with several input rows on
// 16-register targets walk a block one weight row at a time instead, the
// inputs read from L1 by each row's FMAs: the MT x R accumulators leave no
// room for all R rows' dequantized registers and scales, which spilled
// (M = 2 and 4 on a Zen 3 about 10% and 7% faster; docs/projections.md).
// Every accumulator adds the same products in the same order either way.
template <template <int> class W, int R, int MT, int kLocality>
KDA_INLINE void TileSpan(const GemvArgs& a, int64_t n, int64_t m0, int64_t b0, int64_t b1, int64_t ahead,
                         Vec::Reg (&acc)[R][MT]) {
  W<R> rows(a, n, b0, b1);
  const float* x = a.x + m0 * a.k;
  for (int64_t b = b0; b < b1; ++b) {
    rows.Block(b);
    PrefetchBlock<R, kLocality>(rows, b, ahead * W<R>::kBlockBytes);
    if constexpr (W<R>::kDequantizes && MT > 1 && kRegisters < 32) {
      for (int r = 0; r < R; ++r) {
        for (int64_t j = 0; j < kBlock; j += kLanes) {
          const Vec::Reg w = rows.Load(r, b, j);
          for (int i = 0; i < MT; ++i) acc[r][i] = Vec::Fma(w, Vec::Load(x + i * a.k + b * kBlock + j), acc[r][i]);
        }
      }
      continue;
    }
    for (int64_t j = 0; j < kBlock; j += kLanes) {
      const int64_t k = b * kBlock + j;
      if constexpr (MT == 1) {
        // One input row: each weight register used as soon as it is made, so
        // that only one is live beside the accumulators.
        const Vec::Reg xv = Vec::Load(x + k);
        for (int r = 0; r < R; ++r) acc[r][0] = Vec::Fma(rows.Load(r, b, j), xv, acc[r][0]);
        continue;
      }
      Vec::Reg w[R];
      for (int r = 0; r < R; ++r) w[r] = rows.Load(r, b, j);
      for (int i = 0; i < MT; ++i) {
        const Vec::Reg xv = Vec::Load(x + i * a.k + k);
        for (int r = 0; r < R; ++r) acc[r][i] = Vec::Fma(w[r], xv, acc[r][i]);
      }
    }
  }
}

// y for output rows [n, n + R) and input rows [m0, m0 + MT): each
// accumulator's lanes summed, rounded once where the output is bf16.
template <int R, int MT>
KDA_INLINE void StoreTile(const GemvArgs& a, int64_t n, int64_t m0, const Vec::Reg (&acc)[R][MT]) {
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

// Output rows [n, n + R) for input rows [m0, m0 + MT), the whole k in
// registers; the next tile's rows (R rows ahead) are prefetched.
template <template <int> class W, int R, int MT>
KDA_INLINE void Tile(const GemvArgs& a, int64_t n, int64_t m0) {
  Vec::Reg acc[R][MT];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MT; ++i) acc[r][i] = Vec::Zero();
  }
  const int64_t nb = a.k / kBlock;
  TileSpan<W, R, MT, kPrefetchL2>(a, n, m0, 0, nb, R * nb, acc);
  StoreTile<R, MT>(a, n, m0, acc);
}

// Input rows [m0, m) for output rows [n, n + R): tiles of 8, 4, then one of
// 3, 2 or 1 rows (the weight rows stay in cache across a row's tiles, but
// each tile dequantizes or widens them again).
template <template <int> class W, int R>
KDA_INLINE void Rows(const GemvArgs& a, int64_t n, int64_t m0 = 0) {
  if constexpr (R * 8 + R + 2 <= kRegisters) {
    for (; m0 + 8 <= a.m; m0 += 8) Tile<W, R, 8>(a, n, m0);
  }
  for (; m0 + 4 <= a.m; m0 += 4) Tile<W, R, 4>(a, n, m0);
  switch (a.m - m0) {
    case 3:
      Tile<W, R, 3>(a, n, m0);
      return;
    case 2:
      Tile<W, R, 2>(a, n, m0);
      return;
    case 1:
      Tile<W, R, 1>(a, n, m0);
      return;
    default:
      return;
  }
}

// Q8 batches of 8 or more input rows on 16-register targets, which hold one
// output row's 8 accumulators: every output row of a tile reads the 8 input
// rows in full (74 KB in fp32 at hidden 2304, from L2), which bounds the
// step. So a group of up to kGroupRows output rows is walked in spans of
// kSpanBlocks blocks, each span of the 8 input rows (8 KiB) staying in L1
// while the group's weight rows stream by; the accumulators wait in memory
// (L1) between spans. Each row's next span is prefetched, and during the
// last span the next group's first.
constexpr int kGroupRows = 8;
constexpr int64_t kSpanBlocks = 8;

template <template <int> class W>
KDA_INLINE void GroupRows(const GemvArgs& a, int64_t n, int g) {
  const int64_t nb = a.k / kBlock;
  int64_t m0 = 0;
  for (; m0 + 8 <= a.m; m0 += 8) {
    Vec::Reg acc[kGroupRows][1][8];
    for (int r = 0; r < g; ++r) {
      for (int i = 0; i < 8; ++i) acc[r][0][i] = Vec::Zero();
    }
    for (int64_t b0 = 0; b0 < nb; b0 += kSpanBlocks) {
      const int64_t b1 = b0 + kSpanBlocks < nb ? b0 + kSpanBlocks : nb;
      const int64_t ahead = b1 < nb ? kSpanBlocks : g * nb - b0;  // blocks
      for (int r = 0; r < g; ++r) TileSpan<W, 1, 8, kPrefetchL1>(a, n + r, m0, b0, b1, ahead, acc[r]);
    }
    for (int r = 0; r < g; ++r) StoreTile<1, 8>(a, n + r, m0, acc[r]);
  }
  for (int r = 0; r < g; ++r) Rows<W, 1>(a, n + r, m0);
}

template <template <int> class W>
void GemvRange(const GemvArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (kRegisters < 32 && W<1>::kDequantizes && a.m >= 3 && a.m <= 4) {
    // 16 registers and Q8 weights: a tile of 4 output rows x 4 input rows
    // would hold 16 accumulators beside the dequantization; 2 x 4 fits.
    for (; n + 2 <= n1; n += 2) Rows<W, 2>(a, n);
  } else if (kRegisters < 32 && !W<1>::kDequantizes && a.m >= 3) {
    // Dense weights: 3 x 4 (12 accumulators, 3 weight registers and an
    // input's: all 16) spills nothing where 4 x 4 does; the bf16 product at
    // M = 4 measured 12-16% faster than in tiles of 4, fp32 within the noise
    // (tiles of 2, which stream half as many rows at once, were slower).
    // From 5 input rows on, each tile of 4 widens the weight rows again,
    // which costs less than GroupRows' accumulators in memory (M = 8 on a
    // Zen 3: bf16 13-15% faster, fp32 about 5%; docs/projections.md).
    for (; n + 3 <= n1; n += 3) Rows<W, 3>(a, n);
  } else if (a.m <= 4) {
    for (; n + 4 <= n1; n += 4) Rows<W, 4>(a, n);
  } else if constexpr (kRegisters >= 32) {
    for (; n + 3 <= n1; n += 3) Rows<W, 3>(a, n);
    for (; n + 2 <= n1; n += 2) Rows<W, 2>(a, n);
  } else {
    for (; n < n1; n += kGroupRows) GroupRows<W>(a, n, n1 - n < kGroupRows ? static_cast<int>(n1 - n) : kGroupRows);
  }
  for (; n < n1; ++n) Rows<W, 1>(a, n);
}

#if KDA_TARGET == KDA_TARGET_AVX512
// The AVX512-BF16 variant: per block of 32 weights, one register of bf16
// weights (W::LoadDot), then one vdpbf16ps per input row with its 32 bf16
// inputs.
template <template <int> class W, int R, int MT>
KDA_BF16_DOT void TileDot(const GemvArgs& a, int64_t n, int64_t m0) {
  const int64_t nb = a.k / kBlock;
  __m512 acc[R][MT];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MT; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  W<R> rows(a, n, 0, nb);
  const BF16* x = a.x_bf16 + m0 * a.k;
  for (int64_t b = 0; b < nb; ++b) {
    rows.Block(b);
    PrefetchBlock<R, kPrefetchL2>(rows, b, R * nb * W<R>::kBlockBytes);  // the next tile's rows, as in Tile
    __m512bh w[R];
    for (int r = 0; r < R; ++r) w[r] = rows.LoadDot(r, b);
    for (int i = 0; i < MT; ++i) {
      const auto xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i * a.k + b * kBlock));
      for (int r = 0; r < R; ++r) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], w[r], xv);
    }
  }
  StoreTile<R, MT>(a, n, m0, acc);
}

template <template <int> class W, int R>
KDA_BF16_DOT void RowsDot(const GemvArgs& a, int64_t n) {
  int64_t m0 = 0;
  if constexpr (R <= 3) {
    for (; m0 + 8 <= a.m; m0 += 8) TileDot<W, R, 8>(a, n, m0);
  }
  for (; m0 + 4 <= a.m; m0 += 4) TileDot<W, R, 4>(a, n, m0);
  for (; m0 + 2 <= a.m; m0 += 2) TileDot<W, R, 2>(a, n, m0);
  for (; m0 < a.m; ++m0) TileDot<W, R, 1>(a, n, m0);
}

template <template <int> class W>
[[gnu::target("avx512bf16")]] void GemvRangeDot(const GemvArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (a.m <= 4) {
    for (; n + 4 <= n1; n += 4) RowsDot<W, 4>(a, n);
  } else {
    for (; n + 3 <= n1; n += 3) RowsDot<W, 3>(a, n);
    for (; n + 2 <= n1; n += 2) RowsDot<W, 2>(a, n);
  }
  for (; n < n1; ++n) RowsDot<W, 1>(a, n);
}
#undef KDA_BF16_DOT
#endif

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
          if constexpr (kRoundBF16) v = SplitToBF16(v);
          Vec::Store(w + i, v);
        }
      }
    }
  }
}

// Rows W's range on the AVX512-BF16 dot where the call asks for it (a.bf16_dot, taken by the AVX-512 target
// only): whether it ran there.
template <template <int> class W>
KDA_INLINE bool GemvOnBf16Dot([[maybe_unused]] const GemvArgs& a, [[maybe_unused]] int64_t n0,
                              [[maybe_unused]] int64_t n1) {
#if KDA_TARGET == KDA_TARGET_AVX512
  if (a.bf16_dot) {
    GemvRangeDot<W>(a, n0, n1);
    return true;
  }
#endif
  return false;
}

}  // namespace

void Gemv(const GemvArgs& a, int64_t n0, int64_t n1) {
  switch (a.weights) {
    case GemvWeights::kQ8:
      if (GemvOnBf16Dot<Q8Bf16Rows>(a, n0, n1)) return;
      if (a.round_bf16) {
        GemvRange<Q8Bf16Rows>(a, n0, n1);
      } else {
        GemvRange<Q8ExactRows>(a, n0, n1);
      }
      return;
    case GemvWeights::kBF16:
      if (GemvOnBf16Dot<Bf16Rows>(a, n0, n1)) return;
      GemvRange<Bf16Rows>(a, n0, n1);
      return;
    case GemvWeights::kF32:
      GemvRange<F32Rows>(a, n0, n1);
      return;
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
