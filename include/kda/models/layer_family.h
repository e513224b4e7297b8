// The delta-rule layer types kda serves, as data (models/layer_family.cc): per
// type, the model types whose config.json names it, where its tensors sit in
// a checkpoint, its geometry from the config, its tensor table and its layer
// class. Everything else (the pool, the prefix cache, the scheduler, the
// parallel code, int8 weights, `kda quantize`, the CLI and Python) works from
// these. Adding a family: docs/model-families.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/io/config.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_layer.h"
#include "kda/models/layer_weights.h"

namespace kda {

class Communicator;

struct LayerFamily {
  std::string layer_class;               // the transformers class, e.g. "Qwen3NextGatedDeltaNet"
  std::vector<std::string> model_types;  // config.json model_types served by it (the first: its name)
  std::string layer_prefix;              // after "model.layers.{i}.", e.g. "linear_attn."
  DeltaRuleGeometry reference;           // the real model's layer: the embedded default and the benchmarks
  std::function<DeltaRuleGeometry(const ModelConfig&)> geometry;
  std::function<TensorTable(const DeltaRuleGeometry&)> tensors;
  // A layer from this rank's geometry and weights (see DeltaRuleLayer).
  std::function<std::unique_ptr<DeltaRuleLayer>(int layer_id, const DeltaRuleGeometry&, const LayerWeights&, DType,
                                                Communicator*, WeightFormat)>
      make_layer;
};

// Every family, kimi_linear first.
const std::vector<LayerFamily>& LayerFamilies();

// The family serving `model_type`; kda::Error naming it and the supported
// model types otherwise.
const LayerFamily& LayerFamilyFor(const std::string& model_type);

// The supported model types, comma-separated (for messages and --help).
std::string SupportedModelTypesList();

}  // namespace kda
