// kda's own GEMM on the AMX tiles (host side TileGemm in kernels/gemm/linear.cc;
// kernels/gemm/gemm_internal.h): the weights are the tiles' A operand, read in
// place from the Linear's [out, in] rows (no second copy: the layout the
// small-M kernels read too); the input rows are packed per call into the B
// operand's pair-interleaved ("VNNI") layout; a 2 x 2 block of fp32
// accumulator tiles (32 output features x 32 input rows) sums the input dim
// in passes (the whole of it in a job's first span, 256 columns at a time in
// the later ones), kept in the job's accumulator buffer between passes, and
// is transposed into y's rows after the last. The blocking is explained in
// docs/projections.md and gemm_internal.h. Compiled for every target, defined
// on the AVX-512 one (the tiles come with it).
#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/gemm/q8_block.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {

#if KDA_TARGET == KDA_TARGET_AVX512
namespace {

using internal::TileGemmArgs;
using internal::TileGemmJob;

constexpr int64_t kTileRows = 16;   // rows of a tile
constexpr int64_t kTileDepth = 32;  // bf16 of the input dim a tile product sums

// The tile instructions, the masked 16-bit stores and the bf16 rounding of Q8 weights, beyond the
// target's -m flags.
#define KDA_TILE_TARGET [[gnu::target("amx-tile,amx-bf16,avx512bf16,avx512bw,avx512vl,prfchw")]]

}  // namespace

// Input rows [16 b, 16 b + 16) of x [m, k] in the B operand's layout: for each
// pair of input columns, 16 dwords (the pair of each row), rows past m zero.
// xp holds block b at b * k * 16. A 16 x 16 block of dwords (16 rows, 16
// pairs) at a time, transposed in registers.
void TilePackRows(BF16* xp, const BF16* x, int64_t m, int64_t k, int64_t b) {
  float* dst = reinterpret_cast<float*>(xp + b * k * kTileRows);
  const int64_t rows = m - b * kTileRows < kTileRows ? m - b * kTileRows : kTileRows;
  const BF16* src = x + b * kTileRows * k;
  for (int64_t p0 = 0; p0 < k / 2; p0 += kTileRows) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = i < rows ? _mm512_loadu_ps(reinterpret_cast<const float*>(src + i * k + 2 * p0)) : _mm512_setzero_ps();
    }
    Vec::Transpose(r);
    for (int j = 0; j < 16; ++j) _mm512_store_ps(dst + (p0 + j) * kTileRows, r[j]);
  }
}

namespace {

// A pair of accumulator tiles (output features n0.. and n0 + 16.., by input
// rows m0..; the second only with kTwo), stored at c and c + 256, written to
// y's rows m0.. < m and columns n0.. < n, fp32 or rounded once to bf16
// (nearest even, NaN kept): a row's 32 bf16 in one 64-byte store.
template <bool kTwo>
KDA_TILE_TARGET void WriteBlock(const TileGemmArgs& a, const float* c, int64_t n0, int64_t m0) {
  __m512 t0[16];
  __m512 t1[16];
  for (int i = 0; i < 16; ++i) t0[i] = _mm512_load_ps(c + i * kTileRows);
  Vec::Transpose(t0);
  if constexpr (kTwo) {
    for (int i = 0; i < 16; ++i) t1[i] = _mm512_load_ps(c + (kTileRows + i) * kTileRows);
    Vec::Transpose(t1);
  }
  const int64_t cols = a.n - n0 < 2 * kTileRows ? a.n - n0 : 2 * kTileRows;
  const uint32_t bits = cols == 32 ? ~0U : (1U << cols) - 1U;
  const int64_t rows = a.m - m0 < kTileRows ? a.m - m0 : kTileRows;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t at = (m0 + i) * a.ldy + n0;
    if (a.y_bf16 == nullptr) {
      _mm512_mask_storeu_ps(a.y_f32 + at, static_cast<__mmask16>(bits), t0[i]);
      if constexpr (kTwo) _mm512_mask_storeu_ps(a.y_f32 + at + kTileRows, static_cast<__mmask16>(bits >> 16U), t1[i]);
      continue;
    }
    __m512i v = _mm512_castsi256_si512(reinterpret_cast<__m256i>(BF16Bits<Vec>(t0[i])));
    if constexpr (kTwo) v = _mm512_inserti64x4(v, reinterpret_cast<__m256i>(BF16Bits<Vec>(t1[i])), 1);
    _mm512_mask_storeu_epi16(a.y_bf16 + at, static_cast<__mmask32>(bits), v);
  }
}

// y's lines of a block (output features n0.. < n0 + 32, input rows m0.. <
// m0 + 32) fetched for writing while the block's products run: its stores
// then find them in cache instead of waiting for memory.
// (PREFETCHW in asm: GCC 12 drops __builtin_prefetch from a function it
// finds has no other effect.)
KDA_TILE_TARGET void PrefetchOutput(const TileGemmArgs& a, int64_t n0, int64_t m0) {
  const int64_t rows = a.m - m0 < 2 * kTileRows ? a.m - m0 : 2 * kTileRows;
  for (int64_t i = 0; i < rows; ++i) {
    if (a.y_bf16 == nullptr) {
      const float* y = a.y_f32 + (m0 + i) * a.ldy + n0;
      asm volatile("prefetchw %0" : : "m"(*y));
      asm volatile("prefetchw %0" : : "m"(*(y + kTileRows)));
    } else {
      asm volatile("prefetchw %0" : : "m"(*(a.y_bf16 + (m0 + i) * a.ldy + n0)));
    }
  }
}

// Prefetches `lines` cache lines from p (PREFETCHT0 in asm, see PrefetchOutput).
KDA_TILE_TARGET void PrefetchLines(const char* p, int64_t lines) {
  for (int64_t i = 0; i < lines; ++i) asm volatile("prefetcht0 %0" : : "m"(*(p + i * 64)));
}

// A pass's weight tiles in place: rows of stride k (Pass's Weights).
struct DenseWeights {
  const BF16* w;
  int64_t k;
  int64_t Stride() const { return k; }
  const BF16* Step(int64_t s) const { return w + s * kTileDepth; }
};

// One pass: weight rows [n0, n0 + 16 (32 with kTwo)) from `weights` (its
// Step(s): the rows at step s's first input column, Stride() elements apart)
// against the packed input-row blocks [b, b + 1 (2 with kPair)) at x (block b
// at the pass's first column; k the input dim), over `steps` tile depths,
// summed into the accumulator tiles stored at c (four tiles of 16 x 16 fp32,
// in this order: weight rows n0.. and n0 + 16.. by input block b, then both by
// block b + 1), which the first pass starts at zero. Fetches `lines` cache
// lines from pf, spread over the steps.
template <bool kTwo, bool kPair, class Weights>
KDA_TILE_TARGET void Pass(Weights weights, int64_t k, const BF16* x, int64_t steps, float* c, bool first,
                          const char* pf, int64_t lines) {
  const int64_t wrow = weights.Stride();
  const int64_t wstride = wrow * static_cast<int64_t>(sizeof(BF16));
  const BF16* x1 = x + k * kTileRows;
  constexpr int64_t kBStride = kTileRows * 2 * static_cast<int64_t>(sizeof(BF16));  // 64 bytes a pair row
  constexpr int64_t kCStride = kTileRows * static_cast<int64_t>(sizeof(float));
  constexpr int64_t kTile = kTileRows * kTileRows;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, kCStride);
    if constexpr (kPair) _tile_loadd(1, c + 2 * kTile, kCStride);
    if constexpr (kTwo) _tile_loadd(2, c + kTile, kCStride);
    if constexpr (kTwo && kPair) _tile_loadd(3, c + 3 * kTile, kCStride);
  }
  const int64_t per_step = (lines + steps - 1) / steps;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t kk = s * kTileDepth;
    const BF16* w = weights.Step(s);
    if (lines > 0) {
      const int64_t n = per_step < lines ? per_step : lines;
      PrefetchLines(pf, n);
      pf += n * 64;
      lines -= n;
    }
    _tile_loadd(4, w, wstride);
    _tile_loadd(6, x + kk * kTileRows, kBStride);
    if constexpr (kPair) _tile_loadd(7, x1 + kk * kTileRows, kBStride);
    if constexpr (kTwo) _tile_loadd(5, w + kTileRows * wrow, wstride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kPair) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwo) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kTwo && kPair) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, kCStride);
  if constexpr (kPair) _tile_stored(1, c + 2 * kTile, kCStride);
  if constexpr (kTwo) _tile_stored(2, c + kTile, kCStride);
  if constexpr (kTwo && kPair) _tile_stored(3, c + 3 * kTile, kCStride);
}

template <class Weights>
using PassFn = void (*)(Weights, int64_t, const BF16*, int64_t, float*, bool, const char*, int64_t);
// Pass<kTwo, kPair, Weights> by (two weight tiles, two input tiles).
template <class Weights>
constexpr PassFn<Weights> kPasses[2][2] = {{&Pass<false, false, Weights>, &Pass<false, true, Weights>},
                                           {&Pass<true, false, Weights>, &Pass<true, true, Weights>}};

constexpr int64_t kBlock = 4 * kTileRows * kTileRows;  // floats of a 32 x 32 accumulator block

// Input columns [32 s0, 32 s1) of Q8 weight rows [n0, n0 + rows) (rows <= 32; q and scales row
// n0's, k / 32 scales a row) as the bf16 pipeline's weights (Q8BlockBF16: bf16(d q), as
// Q8DequantBF16 gives them) into dst, row r at dst + r * ld, rows [rows, 32) zero; row by row,
// each in order, `ahead` bytes fetched ahead where not 0; a row's scales converted 16 at a time
// where it has that many (one instruction for 16 rather than four for each).
KDA_TILE_TARGET void DequantSteps(BF16* dst, int64_t ld, const int8_t* q, const uint16_t* scales, int64_t k,
                                  int64_t rows, int64_t s0, int64_t s1, int64_t ahead) {
  const int64_t nb = k / kTileDepth;
  for (int64_t r = 0; r < 2 * kTileRows; ++r) {
    if (r >= rows) {
      for (int64_t s = s0; s < s1; ++s)
        _mm512_store_si512(dst + r * ld + (s - s0) * kTileDepth, _mm512_setzero_si512());
      continue;
    }
    for (int64_t s16 = s0; s16 < s1; s16 += 16) {
      const int64_t n = s1 - s16 < 16 ? s1 - s16 : 16;
      alignas(64) float sf[16];
      if (n == 16) {
        _mm512_store_ps(sf,
                        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + r * nb + s16))));
      } else {
        for (int64_t i = 0; i < n; ++i) sf[i] = _cvtsh_ss(scales[r * nb + s16 + i]);
      }
      for (int64_t s = s16; s < s16 + n; ++s) {
        const int64_t at = r * k + s * kTileDepth;
        if (ahead > 0 && s % 2 == 0 && at + ahead < rows * k) asm volatile("prefetcht0 %0" : : "m"(*(q + at + ahead)));
        const __m512bh w = Q8BlockBF16(q + at, _mm512_set1_ps(sf[s - s16]));
        _mm512_store_si512(dst + r * ld + (s - s0) * kTileDepth, reinterpret_cast<__m512i>(w));
      }
    }
  }
}

// A pass's weight tiles from Q8 rows [n0, n0 + rows) (rows <= 32; q and scales row n0's): each
// step dequantized kLead steps ahead of its products into a ring of kSlots slots in L1 (ring), so
// that the dequantization runs beside the tile products and a tile load never waits on the stores
// just made (Pass's Weights; Start() before the pass).
struct Q8RingWeights {
  static constexpr int64_t kSlots = 4;
  static constexpr int64_t kLead = 2;
  static constexpr int64_t kSlot = 2 * kTileRows * kTileDepth;  // bf16 of a slot
  const int8_t* q;
  const uint16_t* scales;
  int64_t k;
  int64_t rows;
  BF16* ring;
  int64_t Stride() const { return kTileDepth; }
  KDA_TILE_TARGET void Start() const {
    for (int64_t s = 0; s < kLead && s < k / kTileDepth; ++s) {
      DequantSteps(ring + s * kSlot, kTileDepth, q, scales, k, rows, s, s + 1, 0);
    }
  }
  KDA_TILE_TARGET const BF16* Step(int64_t s) const {
    if (s + kLead < k / kTileDepth) {
      DequantSteps(ring + (s + kLead) % kSlots * kSlot, kTileDepth, q, scales, k, rows, s + kLead, s + kLead + 1, 0);
    }
    return ring + s % kSlots * kSlot;
  }
};

// The products of the span [s0, s1) of a job of bf16 rows in place (`pairs` pairs of weight tiles),
// summed into j.acc: the job's first span over the whole input dim, weight tiles outer (the rows
// read from memory once, in order), the later spans kTileGemmPassDepth columns at a time, input
// tiles outer (a pair of them in L1 while the job's weight rows pass over it from L2).
KDA_TILE_TARGET KDA_INLINE void SpanProducts(const TileGemmArgs& a, const TileGemmJob& j, const BF16* xp, int64_t s0,
                                             int64_t s1, int64_t pairs) {
  const int64_t k = a.k;
  const int64_t r0 = j.r0;
  const int64_t r1 = j.r1;
  // The job's first span reads its weight rows from memory, whole and in order.
  const int64_t depth = s0 == j.b0 ? k : internal::kTileGemmPassDepth;
  for (int64_t k0 = 0; k0 < k; k0 += depth) {
    const int64_t steps = (k - k0 < depth ? k - k0 : depth) / kTileDepth;
    // Passes over part of the input dim keep a pair of input tiles (in L1) for every weight row of
    // the job; passes over all of it (one span: the weights streamed from memory) use each pair of
    // weight tiles, read from memory, for every input row of the span.
    const int64_t in_pairs = (s1 - s0 + 1) / 2;
    const bool weights_outer = steps * kTileDepth == k;
    for (int64_t i = 0; i < in_pairs * pairs; ++i) {
      const int64_t b = s0 + 2 * (weights_outer ? i % in_pairs : i / pairs);
      const int64_t p = weights_outer ? i / in_pairs : i % pairs;
      const int64_t n0 = r0 + 2 * kTileRows * p;
      float* c = j.acc + (((b - s0) / 2) * pairs + p) * kBlock;
      if (k0 == 0) PrefetchOutput(a, n0, b * kTileRows);
      kPasses<DenseWeights>[n0 + kTileRows < r1][b + 1 < s1](
          DenseWeights{j.w + (n0 - r0) * k + k0, k}, k, xp + (b * k + k0) * kTileRows, steps, c, k0 == 0, nullptr, 0);
    }
  }
}

// The products of a job of Q8 rows in one span (TileGemmJob::q; input blocks [s0, s1), `pairs` pairs
// of weight tiles), summed into j.acc as TileGemmRows sums dense rows, in the same order. Each
// weight is used once there: with one pair of input tiles (M <= 32) each step of a pair of weight
// tiles is dequantized into a ring in L1 beside the products (Q8RingWeights); with two, each pair of
// weight tiles is dequantized whole into j.pair before its products with both. The job's first pair
// of weight tiles is fetched from memory first, each later one during the products of the one before.
KDA_TILE_TARGET KDA_INLINE void Q8SpanProducts(const TileGemmArgs& a, const TileGemmJob& j, const BF16* xp, int64_t s0,
                                               int64_t s1, int64_t pairs) {
  const int64_t k = a.k;
  const int64_t nb = k / kTileDepth;
  const auto rows_at = [&](int64_t n0) { return j.r1 - n0 < 2 * kTileRows ? j.r1 - n0 : 2 * kTileRows; };
  PrefetchLines(reinterpret_cast<const char*>(j.q), (rows_at(j.r0) * k + 63) / 64);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t n0 = j.r0 + 2 * kTileRows * p;
    const int8_t* q = j.q + (n0 - j.r0) * k;
    const uint16_t* scales = j.scales + (n0 - j.r0) * nb;
    // The next pair's rows (contiguous bytes), fetched during the products with the first input pair.
    const int64_t next = n0 + 2 * kTileRows;
    const char* pf = next < j.r1 ? reinterpret_cast<const char*>(q + 2 * kTileRows * k) : nullptr;
    const int64_t lines = next < j.r1 ? (rows_at(next) * k + 63) / 64 : 0;
    if (s1 - s0 <= 2) {
      PrefetchOutput(a, n0, s0 * kTileRows);
      const Q8RingWeights ring{q, scales, k, rows_at(n0), j.pair};
      ring.Start();
      kPasses<Q8RingWeights>[n0 + kTileRows < j.r1][s0 + 1 < s1](ring, k, xp + s0 * k * kTileRows, k / kTileDepth,
                                                                 j.acc + p * kBlock, true, pf, lines);
      continue;
    }
    // The pair's rows read in order, 8 KiB ahead (10% faster at M = 64 than with the next-pair fetch alone).
    DequantSteps(j.pair, k, q, scales, k, rows_at(n0), 0, k / kTileDepth, 8192);
    for (int64_t b = s0; b < s1; b += 2) {
      PrefetchOutput(a, n0, b * kTileRows);
      kPasses<DenseWeights>[n0 + kTileRows < j.r1][b + 1 < s1](
          DenseWeights{j.pair, k}, k, xp + b * k * kTileRows, k / kTileDepth,
          j.acc + (((b - s0) / 2) * pairs + p) * kBlock, true, b == s0 ? pf : nullptr, b == s0 ? lines : 0);
    }
  }
}

}  // namespace

// One job (TileGemmJob): its input blocks a span (a.span rows, a multiple of
// 32) at a time, the span's products summed into j.acc (a 32 x 32 block of
// accumulators per pair of weight tiles and pair of input tiles; SpanProducts,
// or Q8SpanProducts for Q8 rows), then the span's blocks written to y.
KDA_TILE_TARGET void TileGemmRows(const TileGemmArgs& a, const TileGemmJob& j, const BF16* xp) {
  // The tile configuration (64 bytes, palette 1): tiles 0..7 of 16 rows x 64 bytes (bytes per row at
  // 16 + 2 t, little-endian 16 bits; rows at 48 + t).
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;
    cfg[48 + t] = kTileRows;
  }
  _tile_loadconfig(cfg);
  const int64_t r0 = j.r0;
  const int64_t r1 = j.r1;
  const int64_t span_blocks = a.span / kTileRows;
  const int64_t pairs = (r1 - r0 + 2 * kTileRows - 1) / (2 * kTileRows);
  for (int64_t s0 = j.b0; s0 < j.b1; s0 += span_blocks) {
    const int64_t s1 = s0 + span_blocks < j.b1 ? s0 + span_blocks : j.b1;
    if (j.q != nullptr) {
      Q8SpanProducts(a, j, xp, s0, s1, pairs);
    } else {
      SpanProducts(a, j, xp, s0, s1, pairs);
    }
    for (int64_t b = s0; b < s1; b += 2) {
      for (int64_t p = 0; p < pairs; ++p) {
        const int64_t n0 = r0 + 2 * kTileRows * p;
        float* c = j.acc + (((b - s0) / 2) * pairs + p) * kBlock;
        const int64_t m0 = b * kTileRows;
        if (n0 + kTileRows < r1) {
          WriteBlock<true>(a, c, n0, m0);
          if (b + 1 < s1) WriteBlock<true>(a, c + kBlock / 2, n0, m0 + kTileRows);
        } else {
          WriteBlock<false>(a, c, n0, m0);
          if (b + 1 < s1) WriteBlock<false>(a, c + kBlock / 2, n0, m0 + kTileRows);
        }
      }
    }
  }
  _tile_release();
}
#undef KDA_TILE_TARGET
#endif  // KDA_TARGET == KDA_TARGET_AVX512

}  // namespace kda::KDA_TARGET_NS
