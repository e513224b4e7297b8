// One KimiDeltaAttention layer with random weights over a packed prefill
// batch, for the benchmarks (bench/kernels_bench.cc and `kda bench-kernels`):
// Forward() runs the layer (EXTEND through the serving backend and pool), and
// Gemms() runs the layer's own projection Linears alone on the same shapes
// (KimiDeltaAttention::ForwardProjections), so that the two can be timed in
// one run.
#pragma once

#include <cstdint>
#include <memory>

#include "base/act_buffer.h"
#include "kda/kernels/linear.h"
#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/kda_model.h"
#include "kda/models/kimi_delta_attention.h"

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
};

// Decode steps of whole layers at batch N (bf16 or fp32 activations,
// projection weights in `weights`): `layers` layers of random weights, cycled
// so that each step streams its layer's weights and states from memory
// (choose layers with LayersFor), N requests continuing at prefix 16.
struct LayerDecodeProblem {
  LayerDecodeProblem(DType dtype, WeightFormat weights, const KdaLayerShape& layer_shape, int64_t N, int layers);
  LayerDecodeProblem(const LayerDecodeProblem&) = delete;
  LayerDecodeProblem& operator=(const LayerDecodeProblem&) = delete;

  // One DECODE forward of layer i % layers.
  void Step(int64_t i);
  // Bytes one step must move at least: its layer's projection weights (and
  // Q8 scales) read once, its N recurrent states and conv tails read and written.
  int64_t StepBytes() const;
  // Layers whose weights span `bytes` (>> the last-level cache).
  static int LayersFor(int64_t layer_weight_bytes, int64_t bytes);

  KdaModel model;
  RecurrentStatePool pool;
  HybridReqToTokenPool req;
  KDAAttnBackend backend;
  ForwardBatch batch;
  ActBuffer x, out;
};

// The projection GEMMs of whole layers at M rows (activations in `dtype`,
// weights in `weights`): `layers` layers of random weights (KdaModel::Random:
// each layer's own Linears, q/k/v fused), step i running those of layer
// i % layers (KimiDeltaAttention::ForwardProjections), so that with enough
// layers (LayerDecodeProblem::LayersFor) each step streams its weights from
// memory.
struct ProjectionProblem {
  ProjectionProblem(DType dtype, WeightFormat weights, const KdaLayerShape& layer_shape, int64_t M, int layers);
  ProjectionProblem(const ProjectionProblem&) = delete;
  ProjectionProblem& operator=(const ProjectionProblem&) = delete;

  // The projections of layer i % layers on the M rows.
  void Step(int64_t i);
  // Bytes of projection weights (and Q8 scales) one step reads.
  int64_t StepBytes() const { return model.layers.front().projection_weight_bytes(); }

  KdaModel model;
  int64_t rows;
  ActBuffer x;
};

// Bytes of one layer's projection weights (and Q8 scales) at these dtypes (one
// random layer is built to count them).
int64_t LayerProjectionBytes(DType dtype, WeightFormat weights, const KdaLayerShape& layer_shape);

}  // namespace kda::bench
