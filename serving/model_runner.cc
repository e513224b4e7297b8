#include "kda/serving/model_runner.h"

#include <cstring>
#include <string>

#include "base/act_buffer.h"
#include "base/fault_inject.h"
#include "kda/base/error.h"
#include "kda/kernels/elementwise.h"

namespace kda {

ModelRunner::ModelRunner(const DeltaRuleModel& model, MemoryPools pools, KernelImpl kernel)
    : model_(model), pools_(pools), backend_(pools, kernel) {
  const RecurrentStatePool& pool = *pools.state_pool;
  Check(pool.num_layers() == model.num_layers(), "state pool has " + std::to_string(pool.num_layers()) +
                                                     " layers, the model " + std::to_string(model.num_layers()));
  Check(pool.spec() == model.state_spec(), "state pool's state spec differs from the model's");
  Check(pool.conv_dtype() == model.act_dtype, "state pool conv dtype differs from the model's activation dtype");
  // Each layer against the pool once, here, not at every step.
  for (const auto& layer : model.layers) backend_.CheckLayer(layer->attn());
}

void ModelRunner::Forward(const ForwardBatch& batch, ConstBuf x, MutBuf out) {
  backend_.InitForwardMetadata(batch);  // once per batch, shared by every layer
  const int64_t T = backend_.metadata().num_tokens;
  const int64_t hidden = model_.geometry.hidden;
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
    model_.layers[l]->Forward(out, in, backend_);
    if (l + 1 < L) {
      AddInPlace(h.mut(), {out.data, dt}, T * hidden);
    }
  }
  backend_.EndVerify();  // TARGET_VERIFY: every layer ran, its positions wait for their commit
}

void ModelRunner::ForwardLayer(int l, const ForwardBatch& batch, ConstBuf x, MutBuf out) {
  Check(l >= 0 && l < model_.num_layers(),
        [&] { return "model runner: layer " + std::to_string(l) + " of " + std::to_string(model_.num_layers()); });
  Check(batch.mode == ForwardMode::kExtend || batch.mode == ForwardMode::kDecode,
        "model runner: one layer alone runs EXTEND or DECODE batches");
  Check(x.dtype == model_.act_dtype && out.dtype == model_.act_dtype,
        "model runner: activations must be in the model's dtype");
  backend_.InitForwardMetadata(batch);
  model_.layers[l]->Forward(out, x, backend_);
}

void ModelRunner::CommitVerify(const std::vector<int64_t>& req_ids, const std::vector<int64_t>& keep) {
  backend_.InitCommit(req_ids, keep);
  for (const auto& layer : model_.layers) backend_.CommitLayer(layer->attn());
  backend_.EndCommit();
}

}  // namespace kda
