#include <cmath>
#include <random>
#include <string>

#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/models/kimi_linear.h"

namespace kda {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Reads tensor `name`, whose shape must be one of `shapes`, as fp32 values.
std::vector<float> ReadTensor(const Checkpoint& ckpt, const std::string& name,
                              const std::vector<std::vector<int64_t>>& shapes) {
  Check(ckpt.Has(name), "checkpoint is missing tensor " + name);
  const TensorInfo& t = ckpt.Get(name);
  Check(t.dtype == DType::kF32 || t.dtype == DType::kBF16,
        "tensor " + name + " has dtype " + DTypeName(t.dtype) + ", expected BF16 or F32");
  bool ok = false;
  for (const auto& s : shapes) ok = ok || s == t.shape;
  Check(ok, "tensor " + name + " has shape " + ShapeString(t.shape) + ", expected " + ShapeString(shapes.front()));
  return ToFloatVector(t);
}

}  // namespace

KdaLayerShape KdaLayerShapeFromConfig(const KimiLinearConfig& c) {
  KdaLayerShape s;
  s.hidden = c.hidden_size;
  s.H = c.num_heads;
  s.K = c.head_dim;
  s.W = c.conv_size;
  s.rms_norm_eps = c.rms_norm_eps;
  return s;
}

KdaLayerWeights LoadKdaLayerWeights(const Checkpoint& ckpt, const KimiLinearConfig& config, int layer) {
  Check(layer >= 0 && layer < config.num_hidden_layers,
        "layer " + std::to_string(layer) + " is out of range [0, " + std::to_string(config.num_hidden_layers) + ")");
  Check(config.IsKdaLayer(layer), "layer " + std::to_string(layer) + " is not a KDA layer");
  const KdaLayerShape s = KdaLayerShapeFromConfig(config);
  const int64_t hid = s.hidden;
  const int64_t p = s.P();
  const int64_t k = s.K;
  const int64_t h = s.H;
  const int64_t w = s.W;
  const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
  KdaLayerWeights r;
  r.q_proj = ReadTensor(ckpt, pre + "q_proj.weight", {{p, hid}});
  r.k_proj = ReadTensor(ckpt, pre + "k_proj.weight", {{p, hid}});
  r.v_proj = ReadTensor(ckpt, pre + "v_proj.weight", {{p, hid}});
  r.q_conv = ReadTensor(ckpt, pre + "q_conv1d.weight", {{p, 1, w}, {p, w}});
  r.k_conv = ReadTensor(ckpt, pre + "k_conv1d.weight", {{p, 1, w}, {p, w}});
  r.v_conv = ReadTensor(ckpt, pre + "v_conv1d.weight", {{p, 1, w}, {p, w}});
  r.f_a_proj = ReadTensor(ckpt, pre + "f_a_proj.weight", {{k, hid}});
  r.f_b_proj = ReadTensor(ckpt, pre + "f_b_proj.weight", {{p, k}});
  r.b_proj = ReadTensor(ckpt, pre + "b_proj.weight", {{h, hid}});
  r.g_a_proj = ReadTensor(ckpt, pre + "g_a_proj.weight", {{k, hid}});
  r.g_b_proj = ReadTensor(ckpt, pre + "g_b_proj.weight", {{p, k}});
  r.A_log = ReadTensor(ckpt, pre + "A_log", {{1, 1, h, 1}, {h}});
  r.dt_bias = ReadTensor(ckpt, pre + "dt_bias", {{p}});
  r.o_norm = ReadTensor(ckpt, pre + "o_norm.weight", {{k}});
  r.o_proj = ReadTensor(ckpt, pre + "o_proj.weight", {{hid, p}});
  return r;
}

KdaLayerWeights RandomKdaLayerWeights(const KdaLayerShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto normal = [&rng](int64_t n, float stddev) {
    std::normal_distribution<float> d(0.0F, stddev);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = RoundBF16(d(rng));
    return v;
  };
  auto uniform = [&rng](int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng);
    return v;
  };
  const int64_t hid = s.hidden;
  const int64_t p = s.P();
  const int64_t k = s.K;
  const float std_w = 0.02F;
  KdaLayerWeights w;
  w.q_proj = normal(p * hid, std_w);
  w.k_proj = normal(p * hid, std_w);
  w.v_proj = normal(p * hid, std_w);
  w.q_conv = normal(p * s.W, 0.5F);
  w.k_conv = normal(p * s.W, 0.5F);
  w.v_conv = normal(p * s.W, 0.5F);
  w.f_a_proj = normal(k * hid, std_w);
  w.f_b_proj = normal(p * k, 5 * std_w);
  w.b_proj = normal(s.H * hid, 0.05F);
  w.g_a_proj = normal(k * hid, std_w);
  w.g_b_proj = normal(p * k, 0.1F);
  w.o_norm = uniform(k, 0.5F, 1.5F);
  w.o_proj = normal(hid * p, std_w);
  // A_log = log(U[1, 16]); dt_bias = softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1].
  w.A_log = uniform(s.H, 0.0F, std::log(16.0F));
  w.dt_bias = uniform(p, std::log(1e-3F), std::log(1e-1F));
  for (float& x : w.dt_bias) {
    const float dt = std::exp(x);
    x = dt + std::log(-std::expm1(-dt));
  }
  for (auto* v : {&w.o_norm, &w.A_log, &w.dt_bias}) {
    for (float& x : *v) x = RoundBF16(x);
  }
  return w;
}

}  // namespace kda
