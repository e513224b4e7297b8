// The runner that pushes one batch through all delta-rule layers of a model
// (the full model's attention layers, MLPs and norms are outside this
// component), with the one backend that serves them all.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"

namespace kda {

class ModelRunner {
 public:
  // The pools must have been made for this model (one pool layer per layer,
  // the model's state spec, conv dtype = activation dtype);
  // checked here, once. The runner holds them for its backend and for a
  // Scheduler over it; they must outlive the runner.
  ModelRunner(const DeltaRuleModel& model, MemoryPools pools, KernelImpl kernel = KernelImpl::kAuto);

  // Runs one batch through every layer. x [T, hidden] -> out [T, hidden], in
  // the activation dtype, T = batch.num_tokens(). Layer l reads the residual
  // stream h_l (h_0 = x, h_{l+1} = h_l + layer_l(h_l)); out is the last
  // layer's output, so with one layer out = layer(x).
  //
  // A TARGET_VERIFY batch computes every position's output from the committed
  // states (which it leaves as they are) and holds its positions for a commit.
  void Forward(const ForwardBatch& batch, ConstBuf x, MutBuf out);

  // Runs layer l alone on its own input (a replay feeds each layer what it saw
  // while served): x, out [T, hidden] in the activation dtype; EXTEND or
  // DECODE batches (kda::Error otherwise).
  void ForwardLayer(int l, const ForwardBatch& batch, ConstBuf x, MutBuf out);

  // Commits verify steps: request req_ids[i] keeps the first keep[i]
  // positions of its last TARGET_VERIFY batch (0 <= keep[i] <= its 1 + k;
  // docs/speculative.md): afterwards its slot holds the state (recurrent and
  // conv tail, every layer) after exactly those positions. kda::Error on a
  // request without a pending verify step or a count out of range, nothing
  // written.
  void CommitVerify(const std::vector<int64_t>& req_ids, const std::vector<int64_t>& keep);

  // Shows `observer` every batch and every layer's tensors from the next
  // batch on (null: off); see LayerObserver.
  void SetObserver(LayerObserver* observer) { backend_.SetObserver(observer); }

  const DeltaRuleModel& model() const { return model_; }
  const MemoryPools& pools() const { return pools_; }
  const DeltaRuleAttnBackend& backend() const { return backend_; }

 private:
  const DeltaRuleModel& model_;
  MemoryPools pools_;
  DeltaRuleAttnBackend backend_;
};

}  // namespace kda
