// KdaModel: the KDA layers of a Kimi-Linear model, loaded from a checkpoint
// or made at random, whole or one tensor-parallel rank's heads
// (models/kimi_linear/kda_model.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/kda_layer_shape.h"
#include "kda/models/kimi_delta_attention.h"
#include "kda/models/weights.h"

namespace kda {

class Communicator;

// Kimi-Linear-48B-A3B's KDA layer: hidden 2304, 32 heads of 128, conv width 4,
// RMSNorm eps 1e-5 (the embedded default model and the benchmarks' shape).
constexpr KdaLayerShape KimiLinear48BLayerShape() {
  KdaLayerShape s;
  s.hidden = 2304;
  s.H = 32;
  s.K = 128;
  s.W = 4;
  s.rms_norm_eps = 1e-5;
  return s;
}

// The KDA layers of one model, in model order; layers[i] uses pool layer i.
//
// Tensor parallelism: with a `tp` group of size > 1 the model is this rank's
// shard: `shape` (and so the pool a runner needs) has only its heads
// `heads`, and each layer sums its o_proj partials over `tp`.
struct KdaModel {
  KdaLayerShape shape;  // this rank's heads: shape.H = heads.count
  DType act_dtype = DType::kF32;
  WeightFormat weights_format = WeightFormat::kDense;  // of the projections
  KdaHeadShard heads;                                  // the heads held, of heads.total (all of them without tp)
  Communicator* tp = nullptr;                          // the tp group (null: one rank); must outlive the model
  std::vector<int> model_layer_ids;                    // 0-based checkpoint layer index of each KDA layer
  std::vector<KimiDeltaAttention> layers;

  // Every KDA layer of a checkpoint (config.json + safetensors), or only
  // `only_layer` (0-based; it must be a KDA layer). With a `tp` group, only
  // tp rank r's heads are read (kda::Error when tp->size() does not divide
  // the number of heads). Weights holding a NaN or infinity are refused
  // (kda::Error naming the checkpoint key and element). weights_format
  // kInt8: the projections are quantized as they load (each tp rank
  // quantizes only its slices).
  static KdaModel Load(const std::string& model_dir, DType act_dtype, std::optional<int> only_layer = std::nullopt,
                       Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);
  // `num_layers` layers of deterministic random weights (the same full
  // weights on every rank; a `tp` rank keeps its heads' shard).
  static KdaModel Random(const KdaLayerShape& shape, int num_layers, DType act_dtype, uint64_t seed,
                         Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);

  int num_layers() const { return static_cast<int>(layers.size()); }
  // The unsharded model's shape (heads.total heads).
  KdaLayerShape full_shape() const;
};

}  // namespace kda
