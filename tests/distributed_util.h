// Helpers shared by the tensor/data-parallel and int8 checkpoint tests: a KDA
// layer's weights loaded whole or by head shard, the element runs a sharded load must read,
// and golden cases as served requests.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/act_buffer.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "kda/serving/scheduler.h"

namespace kda::testing {

using Runs = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) element runs

// The config's KDA layer geometry (the full layer's, all heads).
inline DeltaRuleGeometry KdaGeometry(const ModelConfig& config) {
  return LayerFamilyFor(config.model_type).geometry(config);
}

// Layer `layer`'s KDA weights (model.layers.{layer}.self_attn.*) as a model
// loads them: only `shard`'s heads (the whole layer without one); `reads`
// (optional) receives the runs of elements read.
inline LayerWeights LoadKdaLayer(const Checkpoint& ckpt, const ModelConfig& config, int layer,
                                 const std::optional<HeadShard>& shard = std::nullopt,
                                 std::vector<TensorRead>* reads = nullptr) {
  const DeltaRuleGeometry full = KdaGeometry(config);
  return LoadLayerWeights(ckpt, "model.layers." + std::to_string(layer) + ".self_attn.",
                          LayerFamilyFor("kimi_linear").tensors(full), shard.value_or(MakeHeadShard(full.H, 0, 1)),
                          reads);
}

// Tensor name -> the runs of elements the shard's load must read (and nothing
// else) for KDA layer `layer` of a model of geometry `s` (the full layer's).
inline std::map<std::string, Runs> ExpectedShardReads(int layer, const DeltaRuleGeometry& s, const HeadShard& shard) {
  const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
  const int64_t hid = s.hidden;
  const int64_t k = s.K;
  const int64_t p = s.key_dim();
  const int64_t h0 = shard.begin;
  const int64_t h1 = shard.begin + shard.count;
  const int64_t p0 = h0 * k;
  const int64_t p1 = h1 * k;
  std::map<std::string, Runs> m;
  for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight"}) m[pre + n] = {{p0 * hid, p1 * hid}};
  for (const char* n : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}) m[pre + n] = {{p0 * s.W, p1 * s.W}};
  for (const char* n : {"f_a_proj.weight", "g_a_proj.weight"}) m[pre + n] = {{0, k * hid}};  // replicated
  for (const char* n : {"f_b_proj.weight", "g_b_proj.weight"}) m[pre + n] = {{p0 * k, p1 * k}};
  m[pre + "b_proj.weight"] = {{h0 * hid, h1 * hid}};
  m[pre + "A_log"] = {{h0, h1}};
  m[pre + "dt_bias"] = {{p0, p1}};
  m[pre + "o_norm.weight"] = {{0, k}};  // replicated
  Runs o;                               // o_proj [hidden, P]: the shard's input columns of every row
  if (p1 - p0 == p) {
    o.emplace_back(0, hid * p);
  } else {
    for (int64_t r = 0; r < hid; ++r) o.emplace_back(r * p + p0, r * p + p1);
  }
  m[pre + "o_proj.weight"] = o;
  return m;
}

inline std::map<std::string, Runs> ByTensor(const std::vector<TensorRead>& reads) {
  std::map<std::string, Runs> m;
  for (const TensorRead& r : reads) m[r.name].emplace_back(r.begin, r.end);
  return m;
}

// A golden case's input: hidden states in the pipeline dtype, sequence
// bounds, and the initial states (full layouts, empty when absent).
struct GoldenInput {
  ActBuffer x;
  std::vector<int64_t> cu;
  std::vector<float> rec;  // [N, H, K, V]
  ActBuffer conv;          // [N, W-1, 3P]
  bool has_initial = false;
};

inline GoldenInput ReadGoldenInput(const SafetensorsFile& f, DType dt) {
  GoldenInput in;
  const std::vector<float> x = ToFloatVector(f.Get("hidden_states"));
  in.x = ActBuffer(dt, static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) in.x.Set(static_cast<int64_t>(i), x[i]);
  in.cu = ToInt64Vector(f.Get("cu_seqlens"));
  in.has_initial = f.Has("initial_recurrent_state");
  if (in.has_initial) {
    in.rec = ToFloatVector(f.Get("initial_recurrent_state"));
    const std::vector<float> c = ToFloatVector(f.Get("initial_conv_state"));
    in.conv = ActBuffer(dt, static_cast<int64_t>(c.size()));
    for (size_t i = 0; i < c.size(); ++i) in.conv.Set(static_cast<int64_t>(i), c[i]);
  }
  return in;
}

// One request per sequence (one layer: state layouts [1, ...] = [...]); the
// last `decode_tokens` rows of each go as DECODE steps.
inline std::vector<ServeRequest> GoldenRequests(const GoldenInput& in, const DeltaRuleGeometry& full,
                                                int64_t decode_tokens) {
  std::vector<ServeRequest> reqs;
  for (size_t n = 0; n + 1 < in.cu.size(); ++n) {
    ServeRequest r;
    r.id = static_cast<int64_t>(n);
    r.input = Offset(in.x.view(), in.cu[n] * full.hidden);
    r.length = in.cu[n + 1] - in.cu[n];
    r.decode_tokens = decode_tokens;
    if (in.has_initial) {
      r.initial_recurrent = in.rec.data() + static_cast<int64_t>(n) * full.state_spec().recurrent_size();
      r.initial_conv = Offset(in.conv.view(), static_cast<int64_t>(n) * full.state_spec().conv_size()).data;
    }
    reqs.push_back(r);
  }
  return reqs;
}

// Results (by id, one per sequence, one layer) flattened to fp32 [T, hidden],
// [N, H, K, V] and [N, W-1, 3P].
struct Flat {
  std::vector<float> out, rec, conv;
};

inline Flat Flatten(const std::vector<RequestResult>& results, DType dt) {
  Flat f;
  for (const RequestResult& r : results) {
    for (size_t i = 0; i < r.out.size() / DTypeSize(dt); ++i) f.out.push_back(LoadAsFloat(r.out.data(), dt, i));
    f.rec.insert(f.rec.end(), r.final_recurrent.begin(), r.final_recurrent.end());
    for (size_t i = 0; i < r.final_conv.size() / DTypeSize(dt); ++i) {
      f.conv.push_back(LoadAsFloat(r.final_conv.data(), dt, i));
    }
  }
  return f;
}

}  // namespace kda::testing
