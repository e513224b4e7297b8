#include "kda/serving/model_runner.h"

#include <cstring>
#include <string>

#include "base/act_buffer.h"
#include "base/fault_inject.h"
#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/kernels/elementwise.h"

namespace kda {

namespace {

// The shard of tp rank r (all heads without a group of size > 1).
KdaHeadShard ShardFor(int total_heads, Communicator* tp) {
  if (tp == nullptr || tp->size() == 1) return MakeKdaHeadShard(total_heads, 0, 1);
  return MakeKdaHeadShard(total_heads, tp->rank(), tp->size());
}

}  // namespace

KdaModel KdaModel::Load(const std::string& model_dir, DType act_dtype, std::optional<int> only_layer,
                        Communicator* tp) {
  const KimiLinearConfig config = LoadKimiLinearConfig(model_dir);
  KdaModel m;
  m.heads = ShardFor(config.num_heads, tp);  // before opening the weights: a bad --tp fails fast
  const Checkpoint ckpt = Checkpoint::Open(model_dir);
  m.shape = ShardLayerShape(KdaLayerShapeFromConfig(config), m.heads);
  m.act_dtype = act_dtype;
  m.tp = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  std::vector<int> ids = config.kda_layers;
  if (only_layer) ids = {*only_layer};  // validated by LoadKdaLayerWeights
  for (int id : ids) {
    MaybeInjectFault(FaultPoint::kLoad);
    const KdaLayerWeights w = LoadKdaLayerWeights(ckpt, config, id, m.heads);
    m.layers.emplace_back(static_cast<int>(m.layers.size()), m.shape, w, act_dtype, m.tp);
    m.model_layer_ids.push_back(id);
  }
  Check(!m.layers.empty(), "model in " + model_dir + " has no KDA layer");
  return m;
}

KdaModel KdaModel::Random(const KdaLayerShape& shape, int num_layers, DType act_dtype, uint64_t seed,
                          Communicator* tp) {
  Check(num_layers >= 1, "a model needs at least one KDA layer");
  KdaModel m;
  m.heads = ShardFor(shape.H, tp);
  m.shape = ShardLayerShape(shape, m.heads);
  m.act_dtype = act_dtype;
  m.tp = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  for (int l = 0; l < num_layers; ++l) {
    MaybeInjectFault(FaultPoint::kLoad);
    const KdaLayerWeights full = RandomKdaLayerWeights(shape, seed + static_cast<uint64_t>(l));
    m.layers.emplace_back(l, m.shape, m.tp == nullptr ? full : ShardKdaLayerWeights(full, shape, m.heads), act_dtype,
                          m.tp);
    m.model_layer_ids.push_back(l);
  }
  return m;
}

KdaLayerShape KdaModel::full_shape() const {
  KdaLayerShape s = shape;
  s.H = heads.total;
  return s;
}

ModelRunner::ModelRunner(const KdaModel& model, MemoryPools pools, KernelImpl kernel)
    : model_(model), backend_(pools, kernel) {
  const RecurrentStatePool& pool = *pools.state_pool;
  const KdaLayerShape& s = model.shape;
  Check(pool.num_layers() == model.num_layers(), "state pool has " + std::to_string(pool.num_layers()) +
                                                     " layers, the model " + std::to_string(model.num_layers()));
  Check(pool.shape().H == s.H && pool.shape().K == s.K && pool.shape().W == s.W,
        "state pool shape differs from the model's");
  Check(pool.conv_dtype() == model.act_dtype, "state pool conv dtype differs from the model's activation dtype");
}

void ModelRunner::Forward(const ForwardBatch& batch, ConstBuf x, MutBuf out) {
  backend_.InitForwardMetadata(batch);  // once per batch, shared by every layer
  const int64_t T = backend_.metadata().num_tokens;
  const int64_t hidden = model_.shape.hidden;
  const DType dt = model_.act_dtype;
  Check(x.dtype == dt && out.dtype == dt, "model runner: activations must be in the model's dtype");
  const int L = model_.num_layers();

  ActBuffer h;
  ConstBuf in = x;
  if (L > 1) {
    h = ActBuffer::Uninitialized(dt, T * hidden);
    std::memcpy(h.data(), x.data, static_cast<size_t>(T * hidden) * DTypeSize(dt));
    in = h.view();
  }
  for (int l = 0; l < L; ++l) {
    MaybeInjectFault(FaultPoint::kForward);
    model_.layers[l].Forward(out, in, backend_);
    if (l + 1 < L) {
      AddInPlace(h.mut(), {out.data, dt}, T * hidden);
    }
  }
}

}  // namespace kda
