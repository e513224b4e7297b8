// The KDA layers of a model and the runner that pushes one batch through all
// of them (the MLA layers, MLPs and norms of the full model are outside this
// component).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kda/dist/communicator.h"
#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/kimi_linear.h"

namespace kda {

// The KDA layers of one model, in model order; layers[i] uses pool layer i.
//
// Tensor parallelism: with a `tp` group of size > 1 the model is this rank's
// shard: `shape` (and so the pool a runner needs) has only its heads
// `heads`, and each layer sums its o_proj partials over `tp`.
struct KdaModel {
  KdaLayerShape shape;  // this rank's heads: shape.H = heads.count
  DType act_dtype = DType::kF32;
  KdaHeadShard heads;                // the heads held, of heads.total (all of them without tp)
  Communicator* tp = nullptr;        // the tp group (null: one rank); must outlive the model
  std::vector<int> model_layer_ids;  // 0-based checkpoint layer index of each KDA layer
  std::vector<KimiDeltaAttention> layers;

  // Every KDA layer of a checkpoint (config.json + safetensors), or only
  // `only_layer` (0-based; it must be a KDA layer). With a `tp` group, only
  // tp rank r's heads are read (kda::Error when tp->size() does not divide
  // the number of heads). Weights holding a NaN or infinity are refused
  // (kda::Error naming the checkpoint key and element).
  static KdaModel Load(const std::string& model_dir, DType act_dtype, std::optional<int> only_layer = std::nullopt,
                       Communicator* tp = nullptr);
  // `num_layers` layers of deterministic random weights (the same full
  // weights on every rank; a `tp` rank keeps its heads' shard).
  static KdaModel Random(const KdaLayerShape& shape, int num_layers, DType act_dtype, uint64_t seed,
                         Communicator* tp = nullptr);

  int num_layers() const { return static_cast<int>(layers.size()); }
  // The unsharded model's shape (heads.total heads).
  KdaLayerShape full_shape() const;
};

class ModelRunner {
 public:
  // The pools must have been made for this model (one pool layer per KDA
  // layer, its heads, head dim and conv width, conv dtype = activation dtype).
  ModelRunner(const KdaModel& model, MemoryPools pools, KernelImpl kernel = KernelImpl::kAuto);

  // Runs one batch through every layer. x [T, hidden] -> out [T, hidden], in
  // the activation dtype, T = batch.num_tokens(). Layer l reads the residual
  // stream h_l (h_0 = x, h_{l+1} = h_l + layer_l(h_l)); out is the last
  // layer's output, so with one layer out = layer(x).
  void Forward(const ForwardBatch& batch, ConstBuf x, MutBuf out);

  // Shows `observer` every batch and every layer's tensors from the next
  // batch on (null: off); see LayerObserver.
  void SetObserver(LayerObserver* observer) { backend_.SetObserver(observer); }

  const KdaModel& model() const { return model_; }
  const KDAAttnBackend& backend() const { return backend_; }

 private:
  const KdaModel& model_;
  KDAAttnBackend backend_;
};

}  // namespace kda
