// DeltaRuleModel: the delta-rule layers of one model (Kimi-Linear's KDA layers,
// Qwen3-Next's or Qwen3.5's Gated DeltaNet layers), loaded from a checkpoint
// by config.json's model_type or made at random, whole or one
// tensor-parallel rank's heads (models/delta_rule_model.cc). The full
// model's attention, MLP and norm layers are outside this component.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/recurrent_state_spec.h"
#include "kda/models/delta_rule_layer.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"

namespace kda {

class Communicator;
class Checkpoint;

// The checkpoint key prefix of layer `layer`'s tensors: "model.layers.{i}." +
// the family's layer prefix, or, when the checkpoint has no tensor there and
// holds a multimodal model's text layers, "model.language_model.layers.{i}." + it,
// or Mamba2's and Nemotron-H's "backbone.layers.{i}." + it.
std::string LayerKeyPrefix(const Checkpoint& ckpt, const LayerFamily& family, int layer);

// The layers of one model, in model order; layers[i] uses pool layer i.
//
// Tensor parallelism: with a `tp` group of size > 1 the model is this rank's
// shard: `geometry` (and so the pool a runner needs) has only its key heads
// `heads` and their value heads, and each layer sums its output-projection
// partials over `tp`.
struct DeltaRuleModel {
  std::string model_type;      // the family's first model type
  DeltaRuleGeometry geometry;  // this rank's heads: geometry.H = heads.count
  DType act_dtype = DType::kF32;
  WeightFormat weights_format = WeightFormat::kDense;  // of the projections
  HeadShard heads;                                     // the key heads held, of heads.total
  Communicator* tp = nullptr;                          // the tp group (null: one rank); must outlive the model
  std::vector<int> model_layer_ids;                    // 0-based checkpoint layer index of each layer
  std::vector<std::unique_ptr<DeltaRuleLayer>> layers;

  // Every delta-rule layer of a checkpoint (config.json + safetensors, one
  // file or a sharded index), or only `only_layer` (0-based; it must be a
  // delta-rule layer). The family comes from config.json's model_type
  // (kda::Error naming an unsupported one). With a `tp` group, only tp rank
  // r's key heads are read (kda::Error when tp->size() does not divide them).
  // Weights holding a NaN or infinity, missing or extra tensors and shapes
  // that disagree with the config are refused (kda::Error naming the key).
  // weights_format kInt8: the projections are quantized as they load (each
  // tp rank quantizes only its slices).
  static DeltaRuleModel Load(const std::string& model_dir, DType act_dtype,
                             std::optional<int> only_layer = std::nullopt, Communicator* tp = nullptr,
                             WeightFormat weights_format = WeightFormat::kDense);
  // The same with model_dir's config.json already read (LoadModelConfig): not parsed again.
  static DeltaRuleModel Load(const std::string& model_dir, const ModelConfig& config, DType act_dtype,
                             std::optional<int> only_layer = std::nullopt, Communicator* tp = nullptr,
                             WeightFormat weights_format = WeightFormat::kDense);
  // `num_layers` layers of the family of `model_type` at the full layer
  // geometry `geometry`, with deterministic random weights (the same full
  // weights on every rank; a `tp` rank keeps its heads' shard).
  static DeltaRuleModel Random(const std::string& model_type, const DeltaRuleGeometry& geometry, int num_layers,
                               DType act_dtype, uint64_t seed, Communicator* tp = nullptr,
                               WeightFormat weights_format = WeightFormat::kDense);

  int num_layers() const { return static_cast<int>(layers.size()); }
  const LayerFamily& family() const { return LayerFamilyFor(model_type); }
  // The unsharded model's geometry (heads.total key heads).
  DeltaRuleGeometry full_geometry() const;
  // What the state pool keeps per request and layer (this rank's heads).
  RecurrentStateSpec state_spec() const { return geometry.state_spec(); }
};

}  // namespace kda
