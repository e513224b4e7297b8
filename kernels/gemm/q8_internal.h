// The Q8 projection kernels' arguments (host side kernels/gemm/q8.cc and
// linear.cc; compute code kernels/gemm/q8_gemm_simd.cc, compiled per instruction
// set and reached through the dispatch table).
#pragma once

#include <cstdint>

#include "kda/base/bf16.h"

namespace kda::internal {

// The most input rows the small-M kernel takes (decode batches); larger
// products dequantize the weight into panels for the GEMM library.
inline constexpr int64_t kQ8GemvMaxRows = 16;

// y [m, n] = x [m, k] . W^T with W the Q8 weight q [n, k], scales [n, k/32]
// (fp16 bits), fp32 accumulation. round_bf16: the bf16 pipeline's weights,
// bf16(fp16(d) * q) (see kda/kernels/q8.h). Exactly one of y_f32 / y_bf16 is
// set (the bf16 output is the fp32 sum rounded once to nearest even).
//
// bf16_dot (AVX512-BF16 CPUs, AVX-512 kernels, bf16 pipeline): x_bf16 holds
// the bf16 inputs and the kernel multiplies them by bf16(fp16(d) * q) with
// vdpbf16ps: exact products (bf16 x bf16 fits fp32), fp32 sums, the
// instruction's flush of subnormal fp32 values (|v| < 2^-126) aside. Else x
// holds the inputs in fp32 and the kernel uses fp32 FMA.
struct Q8GemvArgs {
  const float* x = nullptr;      // [m, k] (bf16 inputs widened, exact)
  const BF16* x_bf16 = nullptr;  // [m, k], with bf16_dot
  bool bf16_dot = false;
  const int8_t* q = nullptr;
  const uint16_t* scales = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool round_bf16 = false;
  float* y_f32 = nullptr;
  BF16* y_bf16 = nullptr;
};

}  // namespace kda::internal
