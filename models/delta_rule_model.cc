#include "kda/models/delta_rule_model.h"

#include <string>
#include <vector>

#include "base/fault_inject.h"
#include "kda/base/error.h"
#include "kda/distributed/communicator.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/models/layer_family.h"

namespace kda {
namespace {

// The shard of tp rank r: whole key heads, or a part of one key head's value heads when there are more ranks.
HeadShard ShardFor(const DeltaRuleGeometry& g, Communicator* tp) {
  if (tp == nullptr || tp->size() == 1) return MakeHeadShard(g.H, 0, 1);
  return MakeHeadShard(g.H, tp->rank(), tp->size(), g.group());
}

}  // namespace

std::string LayerKeyPrefix(const Checkpoint& ckpt, const LayerFamily& family, int layer) {
  const std::vector<std::string> names = ckpt.names();
  const auto holds = [&](const std::string& prefix) {
    const auto it = std::lower_bound(names.begin(), names.end(), prefix);
    return it != names.end() && it->compare(0, prefix.size(), prefix) == 0;
  };
  // model.layers.{i}., else a multimodal checkpoint's text model's, else Mamba2's and Nemotron-H's backbone; the
  // family's prefix, else its others.
  std::vector<std::string> prefixes = {family.layer_prefix};
  prefixes.insert(prefixes.end(), family.other_layer_prefixes.begin(), family.other_layer_prefixes.end());
  for (const std::string& p : prefixes) {
    const std::string suffix = "layers." + std::to_string(layer) + "." + p;
    for (const char* root : {"model.", "model.language_model.", "backbone."}) {
      if (holds(root + suffix)) return root + suffix;
    }
  }
  return "model.layers." + std::to_string(layer) + "." + family.layer_prefix;
}

DeltaRuleModel DeltaRuleModel::Load(const std::string& model_dir, DType act_dtype, std::optional<int> only_layer,
                                    Communicator* tp, WeightFormat weights_format) {
  return Load(model_dir, LoadModelConfig(model_dir), act_dtype, only_layer, tp, weights_format);
}

DeltaRuleModel DeltaRuleModel::Load(const std::string& model_dir, const ModelConfig& config, DType act_dtype,
                                    std::optional<int> only_layer, Communicator* tp, WeightFormat weights_format) {
  const LayerFamily& family = LayerFamilyFor(config.model_type);
  const DeltaRuleGeometry full = family.geometry(config);
  full.Validate("config.json in " + model_dir);
  DeltaRuleModel m;
  m.model_type = family.name();
  m.heads = ShardFor(full, tp);  // before opening the weights: a bad --tp fails fast
  const Checkpoint ckpt = Checkpoint::Open(model_dir);
  m.geometry = full.Shard(m.heads.begin, m.heads.count, m.heads.split);
  m.act_dtype = act_dtype;
  m.weights_format = weights_format;
  m.tp = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  std::vector<int> ids = config.linear_layers;
  if (only_layer) {
    Check(*only_layer >= 0 && *only_layer < config.num_hidden_layers,
          "layer " + std::to_string(*only_layer) + " is out of range [0, " + std::to_string(config.num_hidden_layers) +
              ")");
    Check(config.IsLinearLayer(*only_layer),
          "layer " + std::to_string(*only_layer) + " is not a " + family.layer_class + " layer");
    ids = {*only_layer};
  }
  const TensorTable table = family.tensors(full);
  for (int id : ids) {
    MaybeInjectFault(FaultPoint::kLoad);
    const LayerWeights w = LoadLayerWeights(ckpt, LayerKeyPrefix(ckpt, family, id), table, m.heads);
    m.layers.push_back(
        family.MakeLayer(static_cast<int>(m.layers.size()), m.geometry, w, act_dtype, m.tp, weights_format));
    m.model_layer_ids.push_back(id);
  }
  Check(!m.layers.empty(), "model in " + model_dir + " has no " + family.layer_class + " layer");
  return m;
}

DeltaRuleModel DeltaRuleModel::Random(const std::string& model_type, const DeltaRuleGeometry& geometry, int num_layers,
                                      DType act_dtype, uint64_t seed, Communicator* tp, WeightFormat weights_format) {
  Check(num_layers >= 1, "a model needs at least one layer");
  const LayerFamily& family = LayerFamilyFor(model_type);
  geometry.Validate(family.layer_class);
  DeltaRuleModel m;
  m.model_type = family.name();
  m.heads = ShardFor(geometry, tp);
  m.geometry = geometry.Shard(m.heads.begin, m.heads.count, m.heads.split);
  m.act_dtype = act_dtype;
  m.weights_format = weights_format;
  m.tp = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  const TensorTable table = family.tensors(geometry);
  for (int l = 0; l < num_layers; ++l) {
    MaybeInjectFault(FaultPoint::kLoad);
    const LayerWeights full = RandomLayerWeights(table, seed + static_cast<uint64_t>(l));
    m.layers.push_back(family.MakeLayer(l, m.geometry, m.tp == nullptr ? full : ShardLayerWeights(full, table, m.heads),
                                        act_dtype, m.tp, weights_format));
    m.model_layer_ids.push_back(l);
  }
  return m;
}

DeltaRuleGeometry DeltaRuleModel::full_geometry() const {
  DeltaRuleGeometry g = geometry;
  g.H = heads.total;
  g.HV = heads.total * geometry.group() * heads.split;
  g.head_split = 1;
  return g;
}

}  // namespace kda
