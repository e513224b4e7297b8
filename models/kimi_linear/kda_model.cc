#include <string>
#include <vector>

#include "base/fault_inject.h"
#include "kda/base/error.h"
#include "kda/distributed/communicator.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/models/kda_model.h"
#include "kda/models/weights.h"

namespace kda {

namespace {

// The shard of tp rank r (all heads without a group of size > 1).
KdaHeadShard ShardFor(int total_heads, Communicator* tp) {
  if (tp == nullptr || tp->size() == 1) return MakeKdaHeadShard(total_heads, 0, 1);
  return MakeKdaHeadShard(total_heads, tp->rank(), tp->size());
}

}  // namespace

KdaModel KdaModel::Load(const std::string& model_dir, DType act_dtype, std::optional<int> only_layer, Communicator* tp,
                        WeightFormat weights_format) {
  const KimiLinearConfig config = LoadKimiLinearConfig(model_dir);
  KdaModel m;
  m.heads = ShardFor(config.num_heads, tp);  // before opening the weights: a bad --tp fails fast
  const Checkpoint ckpt = Checkpoint::Open(model_dir);
  m.shape = ShardLayerShape(KdaLayerShapeFromConfig(config), m.heads);
  m.act_dtype = act_dtype;
  m.weights_format = weights_format;
  m.tp = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  std::vector<int> ids = config.kda_layers;
  if (only_layer) ids = {*only_layer};  // validated by LoadKdaLayerWeights
  for (int id : ids) {
    MaybeInjectFault(FaultPoint::kLoad);
    const KdaLayerWeights w = LoadKdaLayerWeights(ckpt, config, id, m.heads);
    m.layers.emplace_back(static_cast<int>(m.layers.size()), m.shape, w, act_dtype, m.tp, weights_format);
    m.model_layer_ids.push_back(id);
  }
  Check(!m.layers.empty(), "model in " + model_dir + " has no KDA layer");
  return m;
}

KdaModel KdaModel::Random(const KdaLayerShape& shape, int num_layers, DType act_dtype, uint64_t seed, Communicator* tp,
                          WeightFormat weights_format) {
  Check(num_layers >= 1, "a model needs at least one KDA layer");
  KdaModel m;
  m.heads = ShardFor(shape.H, tp);
  m.shape = ShardLayerShape(shape, m.heads);
  m.act_dtype = act_dtype;
  m.weights_format = weights_format;
  m.tp = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  for (int l = 0; l < num_layers; ++l) {
    MaybeInjectFault(FaultPoint::kLoad);
    const KdaLayerWeights full = RandomKdaLayerWeights(shape, seed + static_cast<uint64_t>(l));
    m.layers.emplace_back(l, m.shape, m.tp == nullptr ? full : ShardKdaLayerWeights(full, shape, m.heads), act_dtype,
                          m.tp, weights_format);
    m.model_layer_ids.push_back(l);
  }
  return m;
}

KdaLayerShape KdaModel::full_shape() const {
  KdaLayerShape s = shape;
  s.H = heads.total;
  return s;
}

}  // namespace kda
