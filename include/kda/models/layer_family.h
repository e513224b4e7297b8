// The delta-rule layer families kda serves, as data: one registry keyed by
// config.json's model_type (models/layer_family.cc; the entries in
// models/families/), each entry holding how the family's config is read, its
// geometry and variant settings, where its tensors sit in a checkpoint and its
// tensor table (which also says what the layer makes of each tensor's rows). Everything else (the one layer class,
// the pool, the prefix cache, the scheduler, the parallel code, int8
// weights, `kda quantize`, the CLI and Python) works from these. Adding a
// family: docs/model-families.md.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/io/config.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_layer.h"
#include "kda/models/layer_weights.h"

namespace kda {

namespace io_internal {
class ConfigFields;
}

class Communicator;

// Where a model type keeps its text model's fields: at the top level, under
// text_config, or either (text_config absent or null: the top level).
enum class ConfigNesting : uint8_t { kFlat, kNested, kNestedOrFlat };

// A config.json model_type a family serves.
struct ModelTypeName {
  ModelTypeName(std::string type, ConfigNesting where = ConfigNesting::kFlat, std::vector<std::string> texts = {})
      : name(std::move(type)), nesting(where), text_types(std::move(texts)) {}
  std::string name;
  ConfigNesting nesting = ConfigNesting::kFlat;
  std::vector<std::string> text_types;  // nested: the accepted text_config.model_type values
};

struct LayerFamily {
  std::string layer_class;                 // the transformers class, e.g. "Qwen3NextGatedDeltaNet"
  std::string description;                 // one sentence: its checkpoint layout and variants (docs, Python)
  std::vector<ModelTypeName> model_types;  // the config.json model types served (the first: the family's name)
  std::string layer_prefix;                // after "model.layers.{i}.", e.g. "linear_attn."
  // Where else a layer may sit, tried after layer_prefix (Zamba2's hybrid layers: "mamba_decoder.mamba.").
  std::vector<std::string> other_layer_prefixes;
  DeltaRuleGeometry reference;  // the real model's layer: the embedded default and the benchmarks
  // The text model's fields (io/config_fields.h) as a ModelConfig; each problem a kda::Error naming the field.
  ModelConfig (*read_config)(const io_internal::ConfigFields& fields) = nullptr;
  // The layer's geometry and variant settings from the config.
  DeltaRuleGeometry (*geometry)(const ModelConfig& config) = nullptr;
  // The tensor table at a geometry (the full layer's or a tp rank's).
  TensorTable (*tensors)(const DeltaRuleGeometry& geometry) = nullptr;

  const std::string& name() const { return model_types.front().name; }
  // A layer of this family from this rank's geometry and weights (DeltaRuleLayer's constructor).
  std::unique_ptr<DeltaRuleLayer> MakeLayer(int layer_id, const DeltaRuleGeometry& geometry,
                                            const LayerWeights& weights, DType act_dtype, Communicator* tp = nullptr,
                                            WeightFormat weights_format = WeightFormat::kDense) const;
};

// Every family, kimi_linear first.
const std::vector<LayerFamily>& LayerFamilies();

// The family serving `model_type`; kda::Error naming it and the supported
// model types otherwise.
const LayerFamily& LayerFamilyFor(const std::string& model_type);

// The supported model types, in registry order (for messages and --help), and comma-separated.
const std::vector<std::string>& SupportedModelTypes();
std::string SupportedModelTypesList();

// Parses config.json text; `origin` (usually the file path) starts every error message. The model_type
// picks the family, which reads its fields with the defaults of its transformers 5.25 config class (its
// entry in models/families/; docs/model-families.md lists them); a config without model_type is read as
// kimi_linear (Kimi-Linear's own configs carry linear_attn_config; the error for a missing one says how an
// untyped config was read). A nested type's text model is read from text_config, whose model_type, when
// given, is one the type names. hidden_size and num_hidden_layers are required for every type; sizes are
// positive integers; rms_norm_eps, when present, a finite number > 0; lower bounds finite numbers < 0;
// booleans true or false; num_v_heads a multiple of num_k_heads; layer_types (null is absent), when given,
// has num_hidden_layers entries; at least one delta-rule layer. Each problem is a kda::Error naming the field
// (text_config.* for nested configs); an unsupported model_type is one naming it and the supported ones.
// The result's model_type is the text model's: a flat config's own (glm5_next_text for a glm5_next config
// without text_config), a nested config's text_config.model_type, or the type's name + "_text".
ModelConfig ParseModelConfig(const std::string& json_text, const std::string& origin);

// Reads MODEL_DIR/config.json ("config.json not found in MODEL_DIR" when absent).
ModelConfig LoadModelConfig(const std::string& model_dir);

}  // namespace kda
