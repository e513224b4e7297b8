// Linear projections: y [M, N] = x [M, K] . W^T with W [N, K] in the Hugging
// Face Linear layout ([out, in]), fp32 accumulation. Dense weights go through
// oneDNN; Q8 weights (kda/kernels/q8.h) through the per-ISA kernels at small
// M (decode: each weight byte read once, dequantized in registers) and through
// oneDNN at large M (prefill), on the weight dequantized one cache-sized tile
// of output rows at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/q8.h"

namespace kda {

// True when the CPU has AVX512-BF16, so bf16 GEMMs run natively; elsewhere
// bf16 weights and inputs are widened to fp32 (the same products, exactly).
bool CpuHasBF16Dot();

class Linear {
 public:
  // w: [out_features, in_features] values. dtype F32 stores them as given;
  // BF16 rounds them to bf16 (a checkpoint's bf16 values stay exact).
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

  void ForwardQ8Small(MutBuf y, ConstBuf x, int64_t m) const;
};

}  // namespace kda
