#include "kda/bench/layer_problem.h"

#include <algorithm>
#include <vector>

#include "kda/base/error.h"

namespace kda::bench {
namespace {

// Deterministic activations in [-1, 1].
void FillInput(ActBuffer& x) {
  for (int64_t i = 0; i < x.size(); ++i) x.Set(i, static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3F);
}

}  // namespace

LayerProblem::LayerProblem(const std::string& model_type, DType dtype, KernelImpl kernel,
                           const DeltaRuleGeometry& geometry, int64_t N, int64_t T)
    : model(DeltaRuleModel::Random(model_type, geometry, 1, dtype, 3)),
      pool(1, N, geometry.state_spec(), dtype),
      req(&pool),
      backend({&pool, &req}, kernel),
      tokens(T),
      x(dtype, T * geometry.hidden),
      out(dtype, T * geometry.hidden) {
  Check(N >= 1 && T >= N && T % N == 0, "layer problem: need N >= 1 and T a multiple of N");
  for (int64_t n = 0; n < N; ++n) {
    batch.req_pool_indices.push_back(req.Alloc(n));
    batch.req_ids.push_back(n);
    batch.extend_lens.push_back(T / N);
    batch.prefix_lens.push_back(0);
  }
  FillInput(x);
}

void LayerProblem::Forward() {
  backend.InitForwardMetadata(batch);
  model.layers.front()->Forward(out.mut(), x.view(), backend);
}

void LayerProblem::Gemms() { model.layers.front()->ForwardProjections(x.view(), tokens); }

LayerDecodeProblem::LayerDecodeProblem(const std::string& model_type, DType dtype, WeightFormat weights,
                                       const DeltaRuleGeometry& layer_shape, int64_t N, int layers)
    : model(DeltaRuleModel::Random(model_type, layer_shape, layers, dtype, 5, nullptr, weights)),
      pool(layers, N, layer_shape.state_spec(), dtype),
      req(&pool),
      backend({&pool, &req}, KernelImpl::kOptimized),
      x(dtype, N * layer_shape.hidden),
      out(dtype, N * layer_shape.hidden) {
  batch.mode = ForwardMode::kDecode;
  for (int64_t n = 0; n < N; ++n) {
    batch.req_pool_indices.push_back(req.Alloc(n));
    batch.req_ids.push_back(n);
    batch.extend_lens.push_back(1);
    batch.prefix_lens.push_back(16);
  }
  FillInput(x);
}

void LayerDecodeProblem::Step(int64_t i) {
  backend.InitForwardMetadata(batch);
  model.layers[static_cast<size_t>(i % model.num_layers())]->Forward(out.mut(), x.view(), backend);
}

int64_t LayerDecodeProblem::StepBytes() const {
  const RecurrentStateSpec s = model.state_spec();
  const auto n = static_cast<int64_t>(batch.req_ids.size());
  const int64_t states =
      n * (s.recurrent_size() * 4 + s.conv_size() * static_cast<int64_t>(DTypeSize(model.act_dtype)));
  return model.layers.front()->projection_weight_bytes() + 2 * states;
}

int LayerDecodeProblem::LayersFor(int64_t layer_weight_bytes, int64_t bytes) {
  return static_cast<int>(std::max<int64_t>(2, (bytes + layer_weight_bytes - 1) / layer_weight_bytes));
}

ProjectionProblem::ProjectionProblem(const std::string& model_type, DType dtype, WeightFormat weights,
                                     const DeltaRuleGeometry& layer_shape, int64_t M, int layers)
    : model(DeltaRuleModel::Random(model_type, layer_shape, layers, dtype, 7, nullptr, weights)),
      rows(M),
      x(dtype, M * layer_shape.hidden) {
  Check(M >= 1 && layers >= 1, "projection problem: need M >= 1 and layers >= 1");
  FillInput(x);
}

void ProjectionProblem::Step(int64_t i) {
  model.layers[static_cast<size_t>(i % model.num_layers())]->ForwardProjections(x.view(), rows);
}

int64_t LayerProjectionBytes(const std::string& model_type, DType dtype, WeightFormat weights,
                             const DeltaRuleGeometry& geometry) {
  return DeltaRuleModel::Random(model_type, geometry, 1, dtype, 7, nullptr, weights)
      .layers.front()
      ->projection_weight_bytes();
}

}  // namespace kda::bench
