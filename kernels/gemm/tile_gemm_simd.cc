// kda's own GEMM on the AMX tiles (host side TileGemm in kernels/gemm/linear.cc;
// kernels/gemm/gemm_internal.h): the weights are the tiles' A operand, read in
// place from the Linear's [out, in] rows (no second copy: the layout the
// small-M kernels read too); the input rows are packed per call into the B
// operand's pair-interleaved ("VNNI") layout; a 2 x 2 block of fp32
// accumulator tiles (32 output features x 32 input rows) sums the whole input
// dim, then is transposed into y's rows. Compiled for every target, defined
// on the AVX-512 one (the tiles come with it).
#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {

#if KDA_TARGET == KDA_TARGET_AVX512
namespace {

using internal::TileGemmArgs;

constexpr int64_t kTileRows = 16;   // rows of a tile
constexpr int64_t kTileDepth = 32;  // bf16 of the input dim a tile product sums

// The tile instructions and the masked 16-bit stores, beyond the target's -m flags.
#define KDA_TILE_TARGET [[gnu::target("amx-tile,amx-bf16,avx512bw,avx512vl")]]

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

// An accumulator tile (16 output features n0.. x 16 input rows m0..), stored
// at c, written to y's rows m0.. < m and columns n0.. < n, fp32 or rounded
// once to bf16 (nearest even, NaN kept).
KDA_TILE_TARGET void WriteBlock(const TileGemmArgs& a, float* c, int64_t n0, int64_t m0) {
  __m512 t[16];
  for (int i = 0; i < 16; ++i) t[i] = _mm512_load_ps(c + i * kTileRows);
  Vec::Transpose(t);
  const int64_t cols = a.n - n0 < kTileRows ? a.n - n0 : kTileRows;
  const auto mask = static_cast<__mmask16>((1U << cols) - 1U);
  const int64_t rows = a.m - m0 < kTileRows ? a.m - m0 : kTileRows;
  for (int64_t i = 0; i < rows; ++i) {
    const __m512 v = t[i];
    const int64_t at = (m0 + i) * a.ldy + n0;
    if (a.y_bf16 == nullptr) {
      _mm512_mask_storeu_ps(a.y_f32 + at, mask, v);
      continue;
    }
    _mm256_mask_storeu_epi16(a.y_bf16 + at, mask, reinterpret_cast<__m256i>(BF16Bits<Vec>(v)));
  }
}

// Weight rows [n0, n0 + 16 (32 with kTwo)) at w (row stride k) against the
// packed input-row blocks [b, b + 1 (2 with kPair)): the whole input dim
// summed in tiles 0..3, then written to y.
template <bool kTwo, bool kPair>
KDA_TILE_TARGET void Block2x2(const TileGemmArgs& a, const BF16* w, const BF16* xp, int64_t n0, int64_t b, float* c) {
  const int64_t k = a.k;
  const int64_t wstride = k * static_cast<int64_t>(sizeof(BF16));
  const BF16* w0 = w;
  const BF16* w1 = w + kTileRows * k;
  const BF16* x0 = xp + b * k * kTileRows;
  const BF16* x1 = x0 + k * kTileRows;
  constexpr int64_t kBStride = kTileRows * 2 * static_cast<int64_t>(sizeof(BF16));  // 64 bytes a pair row
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kk = 0; kk < k; kk += kTileDepth) {
    _tile_loadd(4, w0 + kk, wstride);
    _tile_loadd(6, x0 + kk * kTileRows, kBStride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kPair) {
      _tile_loadd(7, x1 + kk * kTileRows, kBStride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kTwo) {
      _tile_loadd(5, w1 + kk, wstride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kPair) _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t m0 = b * kTileRows;
  constexpr int64_t kCStride = kTileRows * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, c, kCStride);
  WriteBlock(a, c, n0, m0);
  if constexpr (kPair) {
    _tile_stored(1, c, kCStride);
    WriteBlock(a, c, n0, m0 + kTileRows);
  }
  if constexpr (kTwo) {
    _tile_stored(2, c, kCStride);
    WriteBlock(a, c, n0 + kTileRows, m0);
    if constexpr (kPair) {
      _tile_stored(3, c, kCStride);
      WriteBlock(a, c, n0 + kTileRows, m0 + kTileRows);
    }
  }
}

template <bool kTwo>
KDA_TILE_TARGET void Blocks(const TileGemmArgs& a, const BF16* w, const BF16* xp, int64_t n0, int64_t b0, int64_t b1,
                            float* c) {
  int64_t b = b0;
  for (; b + 2 <= b1; b += 2) Block2x2<kTwo, true>(a, w, xp, n0, b, c);
  if (b < b1) Block2x2<kTwo, false>(a, w, xp, n0, b, c);
}

}  // namespace

// Weight rows [r0, r1) at w (row r0's weights, row stride k, readable to a
// multiple of 32 rows) against every packed input row: the rows of a span
// (a.span, a multiple of 32) against all the job's weight rows, span by span,
// so that the job's weight rows stay in L2 and a span's packed rows too.
KDA_TILE_TARGET void TileGemmRows(const TileGemmArgs& a, const BF16* w, const BF16* xp, int64_t r0, int64_t r1) {
  // The tile configuration (64 bytes, palette 1): tiles 0..7 of 16 rows x 64 bytes (bytes per row at
  // 16 + 2 t, little-endian 16 bits; rows at 48 + t).
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;
    cfg[48 + t] = kTileRows;
  }
  _tile_loadconfig(cfg);
  alignas(64) float c[kTileRows * kTileRows];
  const int64_t blocks = (a.m + kTileRows - 1) / kTileRows;
  const int64_t span_blocks = a.span / kTileRows;
  for (int64_t s0 = 0; s0 < blocks; s0 += span_blocks) {
    const int64_t s1 = s0 + span_blocks < blocks ? s0 + span_blocks : blocks;
    for (int64_t n0 = r0; n0 < r1; n0 += 2 * kTileRows) {
      const BF16* wn = w + (n0 - r0) * a.k;
      if (n0 + kTileRows < r1) {
        Blocks<true>(a, wn, xp, n0, s0, s1, c);
      } else {
        Blocks<false>(a, wn, xp, n0, s0, s1, c);
      }
    }
  }
  _tile_release();
}
#undef KDA_TILE_TARGET
#endif  // KDA_TARGET == KDA_TARGET_AVX512

}  // namespace kda::KDA_TARGET_NS
