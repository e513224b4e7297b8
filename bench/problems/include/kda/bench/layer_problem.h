// One delta-rule layer (of the family of `model_type`, at `geometry`) with
// random weights over a packed prefill batch, for the benchmarks
// (bench/kernels_bench.cc and `kda bench-kernels`): Forward() runs the layer
// (EXTEND through the serving backend and pool), and Gemms() runs the layer's
// own projection Linears alone on the same shapes
// (DeltaRuleLayer::ForwardProjections), so that the two can be timed in one
// run.
#pragma once

#include <cstdint>
#include <memory>

#include <string>
#include "base/act_buffer.h"
#include "kda/kernels/linear.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"

namespace kda::bench {

struct LayerProblem {
  // N sequences of T/N tokens.
  LayerProblem(const std::string& model_type, DType dtype, KernelImpl kernel, const DeltaRuleGeometry& geometry,
               int64_t N, int64_t T);
  LayerProblem(const LayerProblem&) = delete;
  LayerProblem& operator=(const LayerProblem&) = delete;

  // One layer forward over the batch (every sequence starts from a zero state).
  void Forward();
  // The layer's projection GEMMs alone, on the same shapes.
  void Gemms();

  DeltaRuleModel model;  // one layer
  RecurrentStatePool pool;
  HybridReqToTokenPool req;
  DeltaRuleAttnBackend backend;
  ForwardBatch batch;
  int64_t tokens;
  ActBuffer x, out;
};

// Decode steps of whole layers at batch N (bf16 or fp32 activations,
// projection weights in `weights`): `layers` layers of random weights, cycled
// so that each step streams its layer's weights and states from memory
// (choose layers with LayersFor), N requests continuing at prefix 16.
struct LayerDecodeProblem {
  LayerDecodeProblem(const std::string& model_type, DType dtype, WeightFormat weights,
                     const DeltaRuleGeometry& geometry, int64_t N, int layers);
  LayerDecodeProblem(const LayerDecodeProblem&) = delete;
  LayerDecodeProblem& operator=(const LayerDecodeProblem&) = delete;

  // One DECODE forward of layer i % layers.
  void Step(int64_t i);
  // Bytes one step must move at least: its layer's projection weights (and
  // Q8 scales) read once, its N recurrent states and conv tails read and written.
  int64_t StepBytes() const;
  // Layers whose weights span `bytes` (>> the last-level cache).
  static int LayersFor(int64_t layer_weight_bytes, int64_t bytes);

  DeltaRuleModel model;
  RecurrentStatePool pool;
  HybridReqToTokenPool req;
  DeltaRuleAttnBackend backend;
  ForwardBatch batch;
  ActBuffer x, out;
};

// The projection GEMMs of whole layers at M rows (activations in `dtype`,
// weights in `weights`): `layers` layers of random weights (DeltaRuleModel::Random:
// each layer's own Linears, q/k/v fused), step i running those of layer
// i % layers (DeltaRuleLayer::ForwardProjections), so that with enough
// layers (LayerDecodeProblem::LayersFor) each step streams its weights from
// memory.
struct ProjectionProblem {
  ProjectionProblem(const std::string& model_type, DType dtype, WeightFormat weights, const DeltaRuleGeometry& geometry,
                    int64_t M, int layers);
  ProjectionProblem(const ProjectionProblem&) = delete;
  ProjectionProblem& operator=(const ProjectionProblem&) = delete;

  // The projections of layer i % layers on the M rows.
  void Step(int64_t i);
  // Bytes of projection weights (and Q8 scales) one step reads.
  int64_t StepBytes() const { return model.layers.front()->projection_weight_bytes(); }

  DeltaRuleModel model;
  int64_t rows;
  ActBuffer x;
};

// Bytes of one layer's projection weights (and Q8 scales) at these dtypes (one
// random layer is built to count them).
int64_t LayerProjectionBytes(const std::string& model_type, DType dtype, WeightFormat weights,
                             const DeltaRuleGeometry& geometry);

}  // namespace kda::bench
