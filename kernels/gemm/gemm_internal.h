// The projection kernels' arguments (host side kernels/gemm/linear.cc; compute
// code kernels/gemm/gemm_simd.cc, compiled per instruction set and reached
// through the dispatch table).
#pragma once

#include <cstdint>
#include <string>

#include "kda/base/bf16.h"
#include "kda/kernels/gemm_route.h"

namespace kda {
struct Q8Weight;
}  // namespace kda

namespace kda::internal {

// The most input rows the small-M kernels take: the decode class of the GEMM
// routes; larger products go to the GEMM library (Q8 weights dequantized
// into panels).
inline constexpr int64_t kGemvMaxRows = kGemmDecodeMaxRows;
// Dense weights reach the small-M kernels when their input dim is a multiple
// of this (the kernels' block; Q8 weights always are).
inline constexpr int64_t kGemvBlock = 32;

// The weight formats of the small-M product.
enum class GemvWeights : uint8_t {
  kQ8,    // q [n, k] int8 and scales [n, k/32] (fp16 bits); see kda/kernels/q8.h
  kF32,   // w_f32 [n, k]
  kBF16,  // w_bf16 [n, k]
};

// y [m, n] = x [m, k] . W^T, fp32 accumulation, k a multiple of kGemvBlock.
// Exactly one of y_f32 / y_bf16 is set (the bf16 output is the fp32 sum
// rounded once to nearest even).
//
// round_bf16 (Q8 only): the bf16 pipeline's weights, bf16(fp16(d) * q) (see
// kda/kernels/q8.h). bf16_dot (AVX-512 kernels on an AVX512-BF16 CPU; Q8 or
// BF16 weights): x_bf16 holds the bf16 inputs, multiplied by the bf16 weights
// with vdpbf16ps: exact products (bf16 x bf16 fits fp32), fp32 sums, the
// instruction's flush of subnormal fp32 values (|v| < 2^-126) aside. Else x
// holds the inputs in fp32 (bf16 inputs widened: exact) and the kernel uses
// fp32 FMA on the weights widened to fp32 (exact).
struct GemvArgs {
  GemvWeights weights = GemvWeights::kF32;
  const int8_t* q = nullptr;
  const uint16_t* scales = nullptr;
  const float* w_f32 = nullptr;
  const BF16* w_bf16 = nullptr;
  const float* x = nullptr;      // [m, k]
  const BF16* x_bf16 = nullptr;  // [m, k], with bf16_dot
  bool bf16_dot = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool round_bf16 = false;
  float* y_f32 = nullptr;
  BF16* y_bf16 = nullptr;
};

// y [m, n] (row stride ldy) = x [m, k] . W^T on the AMX tiles (TileGemm, kernels/gemm/linear.cc;
// compute code kernels/gemm/tile_gemm_simd.cc): W [n, k] bf16 row-major (the Linear's weights,
// read in place, or Q8 weights dequantized a job's rows at a time), x bf16, bf16 products summed
// in fp32 (the tiles' flush of subnormal fp32 values aside), k a multiple of 32. Exactly one of
// y_f32 / y_bf16 is set (bf16: the sum rounded once to nearest even).
struct TileGemmArgs {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t span = 0;  // input rows per span (a multiple of 32), see kTileGemmSpanRows
  float* y_f32 = nullptr;
  BF16* y_bf16 = nullptr;
  int64_t ldy = 0;
};
// One job of TileGemm: weight rows [r0, r1) at w (row r0's, readable to a
// multiple of 32 rows) against the packed input-row blocks [b0, b1) (16 rows
// each; b0 a multiple of a span's blocks), summed in acc (64-byte aligned;
// (r1 - r0 rounded up to 32) x span floats). A job of one span may take its
// rows as Q8 instead (q, scales: row r0's; w null): each pair of weight tiles
// is then dequantized into `pair` (64-byte aligned, TileGemmQ8PairValues(k)
// bf16) beside its products (a step at a time into a ring, or whole before
// them), while the next pair's bytes are fetched from memory.
struct TileGemmJob {
  const BF16* w = nullptr;
  const int8_t* q = nullptr;
  const uint16_t* scales = nullptr;
  BF16* pair = nullptr;
  int64_t r0 = 0;
  int64_t r1 = 0;
  int64_t b0 = 0;
  int64_t b1 = 0;
  float* acc = nullptr;
};
// Points a's output (y_f32 or y_bf16, the other left null) at y, an F32 or BF16 buffer.
template <class Args>
void SetGemmOutput(Args& a, void* y, bool bf16) {
  if (bf16) {
    a.y_bf16 = static_cast<BF16*>(y);
  } else {
    a.y_f32 = static_cast<float*>(y);
  }
}
// The input dim TileGemm sums per tile product; its k is a multiple of it.
inline constexpr int64_t kTileGemmDepth = 32;
// How TileGemm blocks the product (measured on Xeon family 6 model 207, whose last-level cache
// delivers about 14 GB/s to a core, so a packed input row must serve as many weight rows as L2
// holds): jobs of as many weight rows as kTileGemmJobBytes of bf16 hold (a multiple of 32, at most
// kTileGemmJobRows) stay in L2 while the spans' packed rows, at most kTileGemmSpanRows each, pass
// over them. A job's first span reads the weight rows from memory: each pair of weight tiles
// sums its rows whole, in order, against every input row of the span; in the later spans a pass
// sums kTileGemmPassDepth input columns of a pair of input tiles (in L1) against every weight row
// of the job, the accumulators kept between passes. (One thread, M = 2048, N = 4096, k = 2304:
// 1.2x the speed of 128-row jobs and spans summing whole rows.)
inline constexpr int64_t kTileGemmSpanRows = 64;
inline constexpr int64_t kTileGemmJobRows = 256;
inline constexpr int64_t kTileGemmJobBytes = int64_t{1} << 20;
inline constexpr int64_t kTileGemmPassDepth = 256;
// The bf16 values of TileGemmJob::pair for input dim k: a pair of Q8 weight tiles' rows, or a ring
// of four steps of them.
inline constexpr int64_t TileGemmQ8PairValues(int64_t k) { return 32 * (k > 128 ? k : 128); }
// Whether this process can run TileGemm: the tiles granted, AVX512-BF16, the AVX-512 kernels active.
bool TileGemmRuns();
// The weights: dense bf16 rows (w) or Q8 rows (q8), one of them.
void TileGemm(const TileGemmArgs& a, const BF16* x, const BF16* w, const Q8Weight* q8);

// oneDNN's implementation of a bf16 matmul on the AMX tiles (e.g.
// "brg:avx512_core_amx_bf16"), empty where it offers none (kernels/gemm/linear.cc).
std::string OneDnnTileImplementation();
// Caps oneDNN's instruction set below the tiles for the process; before its
// first primitive.
void CapOneDnnBelowTiles();
// Finds the GEMM engines once (kernels/gemm/gemm_route.cc): called before
// oneDNN's first primitive.
void FindGemmEngines();

// Forgets the SetGemmRoute value and the parsed KDA_GEMM_ROUTE environment
// variable (tests; kernels/gemm/gemm_route.cc).
void ResetGemmRouteForTesting();

}  // namespace kda::internal
