#include "kda/bench/layer_problem.h"

#include <algorithm>
#include <vector>

#include "kda/base/error.h"

namespace kda::bench {

LayerProblem::LayerProblem(DType dtype, KernelImpl kernel, const KdaLayerShape& layer_shape, int64_t N, int64_t T)
    : shape(layer_shape),
      layer(0, shape, RandomKdaLayerWeights(shape, 3), dtype),
      pool(1, N, shape, dtype),
      req(&pool),
      backend({&pool, &req}, kernel),
      tokens(T),
      x(dtype, T * shape.hidden),
      out(dtype, T * shape.hidden),
      y_qkv(dtype, T * 3 * shape.P()),
      y_k(dtype, T * shape.K),
      y_p(dtype, T * shape.P()),
      y_h(dtype, T * shape.H) {
  Check(N >= 1 && T >= N && T % N == 0, "layer problem: need N >= 1 and T a multiple of N");
  for (int64_t n = 0; n < N; ++n) {
    batch.req_pool_indices.push_back(req.Alloc(n));
    batch.req_ids.push_back(n);
    batch.extend_lens.push_back(T / N);
    batch.prefix_lens.push_back(0);
  }
  const int64_t hidden = shape.hidden;
  for (int64_t i = 0; i < T * hidden; ++i) x.Set(i, static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3F);
  const int64_t p = shape.P();
  auto lin = [&](int64_t o, int64_t i) {
    return std::make_unique<Linear>(std::vector<float>(static_cast<size_t>(o * i), 0.01F), o, i, dtype);
  };
  qkv = lin(3 * p, hidden);
  f_a = lin(shape.K, hidden);
  f_b = lin(p, shape.K);
  b = lin(shape.H, hidden);
  g_a = lin(shape.K, hidden);
  g_b = lin(p, shape.K);
  o = lin(hidden, p);
}

void LayerProblem::Forward() {
  backend.InitForwardMetadata(batch);
  layer.Forward(out.mut(), x.view(), backend);
}

void LayerProblem::Gemms() {
  qkv->Forward(y_qkv.mut(), x.view(), tokens);
  f_a->Forward(y_k.mut(), x.view(), tokens);
  f_b->Forward(y_p.mut(), y_k.view(), tokens);
  b->Forward(y_h.mut(), x.view(), tokens);
  g_a->Forward(y_k.mut(), x.view(), tokens);
  g_b->Forward(y_p.mut(), y_k.view(), tokens);
  o->Forward(out.mut(), y_p.view(), tokens);
}

LayerDecodeProblem::LayerDecodeProblem(DType dtype, WeightFormat weights, const KdaLayerShape& layer_shape, int64_t N,
                                       int layers)
    : model(KdaModel::Random(layer_shape, layers, dtype, 5, nullptr, weights)),
      pool(layers, N, layer_shape, dtype),
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
  for (int64_t i = 0; i < N * layer_shape.hidden; ++i) {
    x.Set(i, static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3F);
  }
}

void LayerDecodeProblem::Step(int64_t i) {
  backend.InitForwardMetadata(batch);
  model.layers[static_cast<size_t>(i % model.num_layers())].Forward(out.mut(), x.view(), backend);
}

int64_t LayerDecodeProblem::StepBytes() const {
  const KdaLayerShape& s = model.shape;
  const auto n = static_cast<int64_t>(batch.req_ids.size());
  const int64_t states =
      n * (s.RecurrentStateSize() * 4 + s.ConvStateSize() * static_cast<int64_t>(DTypeSize(model.act_dtype)));
  return model.layers.front().projection_weight_bytes() + 2 * states;
}

int LayerDecodeProblem::LayersFor(int64_t layer_weight_bytes, int64_t bytes) {
  return static_cast<int>(std::max<int64_t>(2, (bytes + layer_weight_bytes - 1) / layer_weight_bytes));
}

}  // namespace kda::bench
