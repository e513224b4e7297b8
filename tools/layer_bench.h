// Whole-layer timing for `kda bench-kernels`: one KimiDeltaAttention layer
// (EXTEND over a packed batch) and, in the same run, its projection GEMMs
// alone through the same GEMM library.
#pragma once

#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/kernels/kda.h"

namespace kda::cli {

struct LayerBenchResult {
  double us_per_token = 0.0;       // median layer time / tokens
  double gemm_us_per_token = 0.0;  // median time of the layer's projection GEMMs / tokens
};

// hidden, H heads of K, conv width W; N sequences of T/N tokens; `repeats`
// timed runs after one warm-up.
LayerBenchResult BenchLayer(DType dtype, KernelImpl kernel, int64_t hidden, int H, int K, int W, int64_t N, int64_t T,
                            int repeats);

}  // namespace kda::cli
