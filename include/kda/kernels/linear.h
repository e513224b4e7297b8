// Linear projections: y [M, N] = x [M, K] . W^T with W [N, K] in the Hugging
// Face Linear layout ([out, in]), fp32 accumulation. Up to 16 rows (decode)
// go through the per-ISA small-M kernels, which read each weight byte once
// and widen or dequantize it in registers; more rows (prefill) through
// oneDNN, Q8 weights (kda/kernels/q8.h) dequantized one cache-sized tile of
// output rows at a time. The bf16 pipeline multiplies by the bf16 dot or by
// fp32 FMAs on widened values, as the GEMM route says (kda/kernels/gemm_route.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/q8.h"

namespace kda {

class Linear {
 public:
  // w: [out_features, in_features] values. dtype F32 stores them as given;
  // BF16 stores them rounded to bf16 (a checkpoint's bf16 values stay exact),
  // whichever the route.
  Linear(const std::vector<float>& w, int64_t out_features, int64_t in_features, DType dtype);
  // Q8 weights [w.rows, w.cols] (checked by CheckQ8Weight). dtype is the
  // activation dtype: F32 multiplies by the dequantized weights, BF16 by the
  // dequantized weights rounded to bf16 (the bf16 pipeline's weight cast).
  Linear(Q8Weight w, DType dtype);
  ~Linear();
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  // y [M, out] = x [M, in] . W^T. x has this Linear's dtype; y is F32 or, for
  // a BF16 Linear, BF16 (the fp32 accumulation rounded once to nearest even).
  void Forward(MutBuf y, ConstBuf x, int64_t m) const;

  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  DType dtype() const { return dtype_; }
  WeightFormat weight_format() const { return format_; }
  // Bytes of weight (and scales) a product streams.
  int64_t weight_bytes() const;

 private:
  struct Impl;
  int64_t out_ = 0;
  int64_t in_ = 0;
  DType dtype_ = DType::kF32;
  WeightFormat format_ = WeightFormat::kDense;
  std::unique_ptr<Impl> impl_;

  // Forward through the small-M kernels (bf16_dot: the bf16 route).
  void ForwardSmall(MutBuf y, ConstBuf x, int64_t m, bool bf16_dot) const;
};

}  // namespace kda
