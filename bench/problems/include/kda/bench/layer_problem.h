// One KimiDeltaAttention layer with random weights over a packed prefill
// batch, for the benchmarks (bench/kernels_bench.cc and `kda bench-kernels`):
// Forward() runs the layer (EXTEND through the serving backend and pool), and
// Gemms() runs the same projection GEMMs alone, as separate Linears of the
// layer's shapes through the same GEMM library, so that the two can be timed
// in one run.
#pragma once

#include <cstdint>
#include <memory>

#include "base/act_buffer.h"
#include "kda/kernels/gemm.h"
#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/kimi_linear.h"

namespace kda::bench {

struct LayerProblem {
  // N sequences of T/N tokens.
  LayerProblem(DType dtype, KernelImpl kernel, const KdaLayerShape& layer_shape, int64_t N, int64_t T);
  LayerProblem(const LayerProblem&) = delete;
  LayerProblem& operator=(const LayerProblem&) = delete;

  // One layer forward over the batch (every sequence starts from a zero state).
  void Forward();
  // The layer's projection GEMMs alone, on the same shapes.
  void Gemms();

  KdaLayerShape shape;
  KimiDeltaAttention layer;
  RecurrentStatePool pool;
  HybridReqToTokenPool req;
  KDAAttnBackend backend;
  ForwardBatch batch;
  int64_t tokens;
  ActBuffer x, out;
  ActBuffer y_qkv, y_k, y_p, y_h;
  std::unique_ptr<Linear> qkv, f_a, f_b, b, g_a, g_b, o;
};

}  // namespace kda::bench
