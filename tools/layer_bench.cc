#include "tools/layer_bench.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/serving/model_runner.h"

namespace kda::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
double TimeUs(const Fn& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LayerBenchResult BenchLayer(DType dtype, KernelImpl kernel, int64_t hidden, int H, int K, int W, int64_t N, int64_t T,
                            int repeats) {
  Check(N >= 1 && T >= N && T % N == 0 && repeats >= 1, "layer bench: need N >= 1, T a multiple of N, repeats >= 1");
  KdaLayerShape shape;
  shape.hidden = hidden;
  shape.H = H;
  shape.K = K;
  shape.W = W;
  const KdaLayerWeights w = RandomKdaLayerWeights(shape, 3);
  const KimiDeltaAttention layer(0, shape, w, dtype);
  RecurrentStatePool pool(1, N, {H, K, W}, dtype);
  HybridReqToTokenPool req(&pool);
  KDAAttnBackend backend({&pool, &req}, kernel);
  ForwardBatch batch;
  for (int64_t n = 0; n < N; ++n) {
    req.Alloc(n);
    batch.req_ids.push_back(n);
    batch.extend_lens.push_back(T / N);
    batch.prefix_lens.push_back(0);
  }
  ActBuffer x(dtype, T * hidden);
  for (int64_t i = 0; i < T * hidden; ++i) x.Set(i, static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3F);
  ActBuffer out(dtype, T * hidden);

  // The same projections as the layer, as separate Linears of the same shapes.
  const int64_t p = shape.P();
  std::vector<float> dummy;
  auto lin = [&](int64_t o, int64_t i) {
    dummy.assign(static_cast<size_t>(o * i), 0.01F);
    return std::make_unique<Linear>(dummy, o, i, dtype);
  };
  const auto qkv = lin(3 * p, hidden);
  const auto fa = lin(K, hidden);
  const auto fb = lin(p, K);
  const auto b = lin(H, hidden);
  const auto ga = lin(K, hidden);
  const auto gb = lin(p, K);
  const auto o = lin(hidden, p);
  ActBuffer y_qkv(dtype, T * 3 * p);
  ActBuffer y_k(dtype, T * K);
  ActBuffer y_p(dtype, T * p);
  ActBuffer y_h(dtype, T * H);
  auto gemms = [&] {
    qkv->Forward(y_qkv.mut(), x.view(), T);
    fa->Forward(y_k.mut(), x.view(), T);
    fb->Forward(y_p.mut(), y_k.view(), T);
    b->Forward(y_h.mut(), x.view(), T);
    ga->Forward(y_k.mut(), x.view(), T);
    gb->Forward(y_p.mut(), y_k.view(), T);
    o->Forward(out.mut(), y_p.view(), T);
  };
  auto forward = [&] {
    backend.InitForwardMetadata(batch);
    layer.Forward(out.mut(), x.view(), backend);
  };
  forward();  // warm-up: primitive creation, page faults
  gemms();
  std::vector<double> layer_us;
  std::vector<double> gemm_us;
  for (int r = 0; r < repeats; ++r) {
    layer_us.push_back(TimeUs(forward));
    gemm_us.push_back(TimeUs(gemms));
  }
  LayerBenchResult res;
  res.us_per_token = Median(layer_us) / static_cast<double>(T);
  res.gemm_us_per_token = Median(gemm_us) / static_cast<double>(T);
  return res;
}

}  // namespace kda::cli
