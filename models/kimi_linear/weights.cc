#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"
#include "kda/models/weights.h"

namespace kda {
namespace {

// Checks that tensor `name` exists, is F32 or BF16 and has one of `shapes`.
const TensorInfo& CheckedTensor(const Checkpoint& ckpt, const std::string& name,
                                const std::vector<std::vector<int64_t>>& shapes) {
  Check(ckpt.Has(name), "checkpoint is missing tensor " + name);
  const TensorInfo& t = ckpt.Get(name);
  Check(t.dtype == DType::kF32 || t.dtype == DType::kBF16,
        "tensor " + name + " has dtype " + DTypeName(t.dtype) + ", expected BF16 or F32");
  bool ok = false;
  for (const auto& s : shapes) ok = ok || s == t.shape;
  Check(ok, "tensor " + name + " has shape " + ShapeString(t.shape) + ", expected " + ShapeString(shapes.front()));
  Check(static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype) == t.nbytes && (t.nbytes == 0 || t.data != nullptr),
        "tensor " + name + ": its data does not match its shape");
  return t;
}

// Reads rows [r0, r1) x columns [c0, c1) of tensor `name` (one of `shapes`)
// viewed as a row-major [numel / cols, cols] matrix, converting only those
// elements from the mapped file. Each contiguous run read is logged. A NaN or
// infinity read is a kda::Error naming the tensor and the element: weights
// are checked once here, so the layer's hot paths need not.
std::vector<float> ReadBlock(const Checkpoint& ckpt, const std::string& name,
                             const std::vector<std::vector<int64_t>>& shapes, int64_t cols, int64_t r0, int64_t r1,
                             int64_t c0, int64_t c1, std::vector<TensorRead>* reads) {
  const TensorInfo& t = CheckedTensor(ckpt, name, shapes);
  const int64_t rows = t.numel() / cols;
  Check(rows * cols == t.numel() && r0 >= 0 && r0 <= r1 && r1 <= rows && c0 >= 0 && c0 <= c1 && c1 <= cols,
        "tensor " + name + ": block out of range");
  const size_t esize = DTypeSize(t.dtype);
  std::vector<float> out;
  out.reserve(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t begin = r * cols + c0;
    const int64_t end = r * cols + c1;
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* p = t.data + static_cast<size_t>(i) * esize;  // memcpy: data may be unaligned
      if (t.dtype == DType::kF32) {
        float v = 0.0F;
        std::memcpy(&v, p, sizeof(v));
        out.push_back(v);
      } else {
        BF16 v;
        std::memcpy(&v.bits, p, sizeof(v.bits));
        out.push_back(ToFloat(v));
      }
      if (!std::isfinite(out.back())) {
        const char* kind = std::isnan(out.back()) ? "nan" : (out.back() > 0 ? "+inf" : "-inf");
        throw Error("checkpoint tensor " + name + " has a non-finite value (" + kind + ") at element " +
                    ElementIndexString(t.shape, i));
      }
    }
    if (reads == nullptr || begin == end) continue;
    if (!reads->empty() && reads->back().name == name && reads->back().end == begin) {
      reads->back().end = end;  // whole rows: one run
    } else {
      reads->push_back({name, begin, end});
    }
  }
  return out;
}

// Rows [r0, r1) of a [rows, cols] view (a slice of the outermost dimension).
std::vector<float> ReadRows(const Checkpoint& ckpt, const std::string& name,
                            const std::vector<std::vector<int64_t>>& shapes, int64_t cols, int64_t r0, int64_t r1,
                            std::vector<TensorRead>* reads) {
  return ReadBlock(ckpt, name, shapes, cols, r0, r1, 0, cols, reads);
}

// Rows [r0, r1) x columns [c0, c1) of a row-major [rows, cols] matrix.
// (Empty for an empty m: the projections of Q8 weights.)
std::vector<float> CutBlock(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  std::vector<float> out;
  if (m.empty()) return out;
  out.reserve(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    out.insert(out.end(), m.begin() + r * cols + c0, m.begin() + r * cols + c1);
  }
  return out;
}

// Rows [r0, r1) x columns [c0, c1) of the Q8 projection `name` ([rows, cols]
// I8 values `name`.weight, F16 scales `name`.weight_scale [rows, cols / 32]);
// c0 and c1 multiples of 32. The values read are checked (CheckQ8Weight).
Q8Weight ReadQ8Block(const Checkpoint& ckpt, const std::string& name, int64_t rows, int64_t cols, int64_t r0,
                     int64_t r1, int64_t c0, int64_t c1, std::vector<TensorRead>* reads) {
  const std::string wname = name + ".weight";
  const std::string sname = name + ".weight_scale";
  Check(cols % kQ8Block == 0 && c0 % kQ8Block == 0 && c1 % kQ8Block == 0,
        "int8 checkpoint: " + wname + " has input dim " + std::to_string(cols) + ", not a multiple of 32");
  Check(ckpt.Has(sname), "int8 checkpoint is missing tensor " + sname);
  const TensorInfo& tq = ckpt.Get(wname);
  const TensorInfo& ts = ckpt.Get(sname);
  Check(tq.dtype == DType::kI8, "tensor " + wname + " has dtype " + DTypeName(tq.dtype) + ", expected I8");
  Check(ts.dtype == DType::kF16, "tensor " + sname + " has dtype " + DTypeName(ts.dtype) + ", expected F16");
  const int64_t nb = cols / kQ8Block;
  Check(tq.shape == std::vector<int64_t>{rows, cols},
        "tensor " + wname + " has shape " + ShapeString(tq.shape) + ", expected " + ShapeString({rows, cols}));
  Check(ts.shape == std::vector<int64_t>{rows, nb},
        "tensor " + sname + " has shape " + ShapeString(ts.shape) + ", expected " + ShapeString({rows, nb}));
  Check(tq.nbytes == static_cast<size_t>(rows * cols) && ts.nbytes == static_cast<size_t>(rows * nb) * 2 &&
            tq.data != nullptr && ts.data != nullptr,
        "tensor " + wname + ": its data does not match its shape");
  Q8Weight w;
  w.rows = r1 - r0;
  w.cols = c1 - c0;
  w.q.resize(static_cast<size_t>(w.rows * w.cols));
  w.scales.resize(static_cast<size_t>(w.rows * (w.cols / kQ8Block)));
  for (int64_t r = r0; r < r1; ++r) {
    std::memcpy(w.q.data() + (r - r0) * w.cols, tq.data + r * cols + c0, static_cast<size_t>(c1 - c0));
    std::memcpy(w.scales.data() + (r - r0) * (w.cols / kQ8Block), ts.data + (r * nb + c0 / kQ8Block) * 2,
                static_cast<size_t>((c1 - c0) / kQ8Block) * 2);
    if (reads != nullptr) {
      reads->push_back({wname, r * cols + c0, r * cols + c1});
      reads->push_back({sname, r * nb + c0 / kQ8Block, r * nb + c1 / kQ8Block});
    }
  }
  CheckQ8Weight(w, "checkpoint tensor " + wname);
  return w;
}

}  // namespace

KdaLayerWeights DequantizeKdaLayerWeights(const KdaLayerWeights& w, const KdaLayerShape& shape) {
  KdaLayerWeights r = w;
  if (w.q8) {  // already Q8: its values
    const KdaLayerQ8Weights& q = *w.q8;
    r.q_proj = DequantizeQ8(q.q_proj);
    r.k_proj = DequantizeQ8(q.k_proj);
    r.v_proj = DequantizeQ8(q.v_proj);
    r.f_a_proj = DequantizeQ8(q.f_a_proj);
    r.f_b_proj = DequantizeQ8(q.f_b_proj);
    r.b_proj = DequantizeQ8(q.b_proj);
    r.g_a_proj = DequantizeQ8(q.g_a_proj);
    r.g_b_proj = DequantizeQ8(q.g_b_proj);
    r.o_proj = DequantizeQ8(q.o_proj);
    r.q8.reset();
    return r;
  }
  const int64_t hid = shape.hidden;
  const int64_t p = shape.P();
  const int64_t kd = shape.K;
  auto rt = [](const std::vector<float>& v, int64_t out, int64_t in, const char* name) {
    return DequantizeQ8(QuantizeQ8(v, out, in, name));
  };
  r.q_proj = rt(w.q_proj, p, hid, "q_proj");
  r.k_proj = rt(w.k_proj, p, hid, "k_proj");
  r.v_proj = rt(w.v_proj, p, hid, "v_proj");
  r.f_a_proj = rt(w.f_a_proj, kd, hid, "f_a_proj");
  r.f_b_proj = rt(w.f_b_proj, p, kd, "f_b_proj");
  r.b_proj = rt(w.b_proj, shape.H, hid, "b_proj");
  r.g_a_proj = rt(w.g_a_proj, kd, hid, "g_a_proj");
  r.g_b_proj = rt(w.g_b_proj, p, kd, "g_b_proj");
  r.o_proj = rt(w.o_proj, hid, p, "o_proj");
  return r;
}

const std::vector<std::string>& KdaProjectionNames() {
  static const std::vector<std::string> names = {"q_proj", "k_proj",   "v_proj",   "f_a_proj", "f_b_proj",
                                                 "b_proj", "g_a_proj", "g_b_proj", "o_proj"};
  return names;
}

KdaLayerShape KdaLayerShapeFromConfig(const KimiLinearConfig& c) {
  KdaLayerShape s;
  s.hidden = c.hidden_size;
  s.H = c.num_heads;
  s.K = c.head_dim;
  s.W = c.conv_size;
  s.rms_norm_eps = c.rms_norm_eps;
  return s;
}

KdaHeadShard MakeKdaHeadShard(int total_heads, int rank, int size) {
  Check(size >= 1 && rank >= 0 && rank < size,
        "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");
  Check(total_heads % size == 0, "the model's " + std::to_string(total_heads) +
                                     " heads cannot be split evenly over --tp " + std::to_string(size) +
                                     " ranks (--tp must divide the number of heads)");
  KdaHeadShard s;
  s.count = total_heads / size;
  s.begin = rank * s.count;
  s.total = total_heads;
  return s;
}

KdaLayerShape ShardLayerShape(const KdaLayerShape& full, const KdaHeadShard& shard) {
  Check(shard.total == full.H && shard.count >= 1 && shard.begin >= 0 && shard.begin + shard.count <= full.H,
        "head shard does not fit the layer's " + std::to_string(full.H) + " heads");
  KdaLayerShape s = full;
  s.H = shard.count;
  return s;
}

KdaLayerWeights LoadKdaLayerWeights(const Checkpoint& ckpt, const KimiLinearConfig& config, int layer) {
  return LoadKdaLayerWeights(ckpt, config, layer, MakeKdaHeadShard(config.num_heads, 0, 1));
}

KdaLayerWeights LoadKdaLayerWeights(const Checkpoint& ckpt, const KimiLinearConfig& config, int layer,
                                    const KdaHeadShard& shard, std::vector<TensorRead>* reads) {
  Check(layer >= 0 && layer < config.num_hidden_layers,
        "layer " + std::to_string(layer) + " is out of range [0, " + std::to_string(config.num_hidden_layers) + ")");
  Check(config.IsKdaLayer(layer), "layer " + std::to_string(layer) + " is not a KDA layer");
  const KdaLayerShape s = KdaLayerShapeFromConfig(config);
  ShardLayerShape(s, shard);  // validates the shard
  const int64_t hid = s.hidden;
  const int64_t p = s.P();
  const int64_t k = s.K;
  const int64_t h = s.H;
  const int64_t w = s.W;
  // This shard's heads, and their rows / channels (h * K + d) in the P-sized dimensions.
  const int64_t h0 = shard.begin;
  const int64_t h1 = shard.begin + shard.count;
  const int64_t p0 = h0 * k;
  const int64_t p1 = h1 * k;
  const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
  KdaLayerWeights r;
  // A `kda quantize` checkpoint: I8 projections with F16 scales.
  if (ckpt.Has(pre + "q_proj.weight") && ckpt.Get(pre + "q_proj.weight").dtype == DType::kI8) {
    KdaLayerQ8Weights q;
    q.q_proj = ReadQ8Block(ckpt, pre + "q_proj", p, hid, p0, p1, 0, hid, reads);
    q.k_proj = ReadQ8Block(ckpt, pre + "k_proj", p, hid, p0, p1, 0, hid, reads);
    q.v_proj = ReadQ8Block(ckpt, pre + "v_proj", p, hid, p0, p1, 0, hid, reads);
    q.f_a_proj = ReadQ8Block(ckpt, pre + "f_a_proj", k, hid, 0, k, 0, hid, reads);
    q.f_b_proj = ReadQ8Block(ckpt, pre + "f_b_proj", p, k, p0, p1, 0, k, reads);
    q.b_proj = ReadQ8Block(ckpt, pre + "b_proj", h, hid, h0, h1, 0, hid, reads);
    q.g_a_proj = ReadQ8Block(ckpt, pre + "g_a_proj", k, hid, 0, k, 0, hid, reads);
    q.g_b_proj = ReadQ8Block(ckpt, pre + "g_b_proj", p, k, p0, p1, 0, k, reads);
    q.o_proj = ReadQ8Block(ckpt, pre + "o_proj", hid, p, 0, hid, p0, p1, reads);
    r.q8 = std::move(q);
  } else {
    r.q_proj = ReadRows(ckpt, pre + "q_proj.weight", {{p, hid}}, hid, p0, p1, reads);
    r.k_proj = ReadRows(ckpt, pre + "k_proj.weight", {{p, hid}}, hid, p0, p1, reads);
    r.v_proj = ReadRows(ckpt, pre + "v_proj.weight", {{p, hid}}, hid, p0, p1, reads);
    r.f_a_proj = ReadRows(ckpt, pre + "f_a_proj.weight", {{k, hid}}, hid, 0, k, reads);
    r.f_b_proj = ReadRows(ckpt, pre + "f_b_proj.weight", {{p, k}}, k, p0, p1, reads);
    r.b_proj = ReadRows(ckpt, pre + "b_proj.weight", {{h, hid}}, hid, h0, h1, reads);
    r.g_a_proj = ReadRows(ckpt, pre + "g_a_proj.weight", {{k, hid}}, hid, 0, k, reads);
    r.g_b_proj = ReadRows(ckpt, pre + "g_b_proj.weight", {{p, k}}, k, p0, p1, reads);
    r.o_proj = ReadBlock(ckpt, pre + "o_proj.weight", {{hid, p}}, p, 0, hid, p0, p1, reads);
  }
  r.q_conv = ReadRows(ckpt, pre + "q_conv1d.weight", {{p, 1, w}, {p, w}}, w, p0, p1, reads);
  r.k_conv = ReadRows(ckpt, pre + "k_conv1d.weight", {{p, 1, w}, {p, w}}, w, p0, p1, reads);
  r.v_conv = ReadRows(ckpt, pre + "v_conv1d.weight", {{p, 1, w}, {p, w}}, w, p0, p1, reads);
  r.A_log = ReadRows(ckpt, pre + "A_log", {{1, 1, h, 1}, {h}}, 1, h0, h1, reads);
  r.dt_bias = ReadRows(ckpt, pre + "dt_bias", {{p}}, 1, p0, p1, reads);
  r.o_norm = ReadRows(ckpt, pre + "o_norm.weight", {{k}}, 1, 0, k, reads);
  return r;
}

KdaLayerWeights ShardKdaLayerWeights(const KdaLayerWeights& w, const KdaLayerShape& full, const KdaHeadShard& shard) {
  ShardLayerShape(full, shard);
  const int64_t hid = full.hidden;
  const int64_t p = full.P();
  const int64_t k = full.K;
  const int64_t p0 = int64_t{shard.begin} * k;
  const int64_t p1 = int64_t{shard.begin + shard.count} * k;
  KdaLayerWeights r;
  r.q_proj = CutBlock(w.q_proj, hid, p0, p1, 0, hid);
  r.k_proj = CutBlock(w.k_proj, hid, p0, p1, 0, hid);
  r.v_proj = CutBlock(w.v_proj, hid, p0, p1, 0, hid);
  r.q_conv = CutBlock(w.q_conv, full.W, p0, p1, 0, full.W);
  r.k_conv = CutBlock(w.k_conv, full.W, p0, p1, 0, full.W);
  r.v_conv = CutBlock(w.v_conv, full.W, p0, p1, 0, full.W);
  r.f_a_proj = w.f_a_proj;
  r.f_b_proj = CutBlock(w.f_b_proj, k, p0, p1, 0, k);
  r.b_proj = CutBlock(w.b_proj, hid, shard.begin, shard.begin + shard.count, 0, hid);
  r.g_a_proj = w.g_a_proj;
  r.g_b_proj = CutBlock(w.g_b_proj, k, p0, p1, 0, k);
  r.A_log = CutBlock(w.A_log, 1, shard.begin, shard.begin + shard.count, 0, 1);
  r.dt_bias = CutBlock(w.dt_bias, 1, p0, p1, 0, 1);
  r.o_norm = w.o_norm;
  r.o_proj = CutBlock(w.o_proj, p, 0, hid, p0, p1);
  if (w.q8) {
    const KdaLayerQ8Weights& q = *w.q8;
    KdaLayerQ8Weights s;
    s.q_proj = SliceQ8(q.q_proj, p0, p1, 0, hid);
    s.k_proj = SliceQ8(q.k_proj, p0, p1, 0, hid);
    s.v_proj = SliceQ8(q.v_proj, p0, p1, 0, hid);
    s.f_a_proj = q.f_a_proj;
    s.f_b_proj = SliceQ8(q.f_b_proj, p0, p1, 0, k);
    s.b_proj = SliceQ8(q.b_proj, shard.begin, shard.begin + shard.count, 0, hid);
    s.g_a_proj = q.g_a_proj;
    s.g_b_proj = SliceQ8(q.g_b_proj, p0, p1, 0, k);
    s.o_proj = SliceQ8(q.o_proj, 0, hid, p0, p1);
    r.q8 = std::move(s);
  }
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
