// The KDA families (a decay per key dimension): Kimi-Linear, GLM-5 Next and Bailing hybrid, each an entry
// of the registry (kda/models/layer_family.h): its config reader (the fields and defaults of its
// transformers 5.25 config class), geometry, tensor table and reference layer.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/config_fields.h"
#include "io/util.h"
#include "kda/base/error.h"
#include "models/families/families.h"

namespace kda::families {
namespace {

using io_internal::ConfigFields;
using io_internal::Describe;
using io_internal::kIntMax;
using io_internal::LayerRule;
using io_internal::ReadIntInRange;
using io_internal::ReadLayers;
using io_internal::ReadSizes;
using nlohmann::json;
using R = TensorRole;

// A KDA config's head count, head dim and conv width as transformers' Kimi-Linear and GLM-5 Next configs read
// them: a linear_attn_config object's num_heads, head_dim and short_conv_kernel_size (the original
// checkpoints'), else the top-level linear_num_heads, linear_head_dim and linear_conv_kernel_dim (what
// transformers writes), else the defaults.
void ReadKdaShape(const ConfigFields& f, const std::optional<ConfigFields>& lac, int64_t default_heads,
                  ModelConfig* config) {
  const auto read = [&](const char* key, const char* lac_key, int64_t fallback) {
    if (lac && lac->Find(lac_key) != nullptr) return static_cast<int>(lac->IntOr(lac_key, fallback));
    return static_cast<int>(f.IntOr(key, fallback));
  };
  config->num_k_heads = config->num_v_heads = read("linear_num_heads", "num_heads", default_heads);
  config->head_k_dim = config->head_v_dim = read("linear_head_dim", "head_dim", 128);
  config->conv_size = read("linear_conv_kernel_dim", "short_conv_kernel_size", 4);
}

// Kimi-Linear (KimiLinearConfig): ReadKdaShape's fields (32 heads by default); the delta-rule layers from
// layer_types, else linear_attn_config.kda_layers (1-based), else every layer but each 4th from layer 4 on.
// `typed`: whether the config named its model_type (an untyped one is read as Kimi-Linear when it has
// linear_attn_config, and a missing one says so).
ModelConfig ReadKimiLinear(const ConfigFields& f, bool typed) {
  static const LayerRule implied{
      {"full_attention"},
      nullptr,
      0,
      [](int64_t layer, int64_t /*layers*/, int64_t /*period*/) { return layer == 0 || layer % 4 != 0; },
      "the implied list (every 4th layer from layer 4 full attention)",
      false};
  const std::string& origin = f.origin();
  ModelConfig config = ReadSizes(f, 1e-5, kIntMax);  // kda_layers lists the layers: no bound but int's
  config.model_type = "kimi_linear";
  Check(typed || f.Find("linear_attn_config", /*null_is_absent=*/true) != nullptr,
        origin +
            ": missing linear_attn_config (a config without model_type is read as kimi_linear; supported "
            "model types: " +
            SupportedModelTypesList() + ")");
  const std::optional<ConfigFields> lac = f.Object("linear_attn_config");
  ReadKdaShape(f, lac, 32, &config);

  const json* layers = lac ? lac->Find("kda_layers") : nullptr;
  if (f.Find("layer_types", /*null_is_absent=*/true) != nullptr || layers == nullptr) {
    f.Expect(config.num_hidden_layers <= io_internal::kMaxImpliedLayers || f.Find("layer_types", true) != nullptr,
             "num_hidden_layers must be a positive integer (at most " + std::to_string(io_internal::kMaxImpliedLayers) +
                 ") without linear_attn_config.kda_layers, got " + std::to_string(config.num_hidden_layers));
    ReadLayers(f, implied, &config);
    return config;
  }
  Check(layers->is_array(), origin + ": linear_attn_config.kda_layers is not an array");
  Check(!layers->empty(), origin + ": linear_attn_config.kda_layers is empty");
  std::set<int64_t> seen;
  for (const json& entry : *layers) {
    const std::string problem = origin + ": linear_attn_config.kda_layers entry " + Describe(entry);
    Check(entry.is_number_integer(), problem + " is not an integer");
    int64_t layer = 0;
    Check(ReadIntInRange(entry, 1, config.num_hidden_layers, &layer),
          problem + " is outside [1, num_hidden_layers = " + std::to_string(config.num_hidden_layers) +
              "] (the list is 1-based)");
    Check(seen.insert(layer).second, problem + " is listed twice");
    config.linear_layers.push_back(static_cast<int>(layer - 1));
  }
  std::sort(config.linear_layers.begin(), config.linear_layers.end());
  return config;
}

ModelConfig ReadKimiLinearTyped(const ConfigFields& f) { return ReadKimiLinear(f, /*typed=*/true); }

const LayerRule& Glm5NextLayers() {  // full_attention is read as indexed_attention
  static const LayerRule rule{{"full_attention", "indexed_attention"},
                              nullptr,
                              0,
                              [](int64_t layer, int64_t /*layers*/, int64_t /*period*/) { return layer % 4 != 3; },
                              "the implied list (every 4th layer indexed attention)",
                              false};
  return rule;
}

// GLM-5-Next (Glm5NextTextConfig): KDA with H = linear_num_heads, K = V = linear_head_dim, conv
// linear_conv_kernel_dim and a lower-bound gate linear_lower_bound (null: the softplus gate); a
// linear_attn_config object, when given, overrides them (num_heads, head_dim, short_conv_kernel_size,
// gate_lower_bound), and its safe_gate (default true) turns a missing bound into -5.
ModelConfig ReadGlm5Next(const ConfigFields& f) {
  ModelConfig config = ReadSizes(f, 1e-5);
  const std::optional<ConfigFields> lac = f.Object("linear_attn_config");
  // The field of linear_attn_config that overrides a top-level one, when both are there.
  const auto source = [&](const char* key, const char* override_key) {
    return lac && lac->Find(override_key) != nullptr ? std::make_pair(*lac, override_key) : std::make_pair(f, key);
  };
  ReadKdaShape(f, lac, 64, &config);
  const auto [fields, name] = source("linear_lower_bound", "gate_lower_bound");
  config.gate_lower_bound = fields.LowerBound(name, -5.0, /*nullable=*/true);
  const bool safe_gate = lac && lac->BoolOr("safe_gate", true);
  if (safe_gate && !config.gate_lower_bound) config.gate_lower_bound = -5.0;
  ReadLayers(f, Glm5NextLayers(), &config);
  return config;
}

// Bailing-hybrid (BailingHybridConfig): KDA with H = num_attention_heads, K = V = head_dim, conv
// short_conv_kernel_size, and the lower-bound gate kda_lower_bound when kda_safe_gate; layer_types, else every
// layer_group_size-th (6) layer attention. A config written by transformers (5.25) holds the KDA shape as
// linear_num_heads, linear_head_dim and linear_conv_kernel_dim, with head_dim overwritten by the attention's
// RoPE width: those fields win where present.
ModelConfig ReadBailingHybrid(const ConfigFields& f) {
  static const LayerRule layers{
      {"full_attention"}, "layer_group_size", 6, io_internal::EveryPeriodthFull, nullptr, false};
  ModelConfig config = ReadSizes(f, 1e-6);
  config.num_k_heads = config.num_v_heads =
      static_cast<int>(f.FirstIntOr({"linear_num_heads", "num_attention_heads"}, 32));
  config.head_k_dim = config.head_v_dim = static_cast<int>(f.FirstIntOr({"linear_head_dim", "head_dim"}, 128));
  config.conv_size = static_cast<int>(f.FirstIntOr({"linear_conv_kernel_dim", "short_conv_kernel_size"}, 4));
  if (f.BoolOr("kda_safe_gate", true)) config.gate_lower_bound = f.LowerBound("kda_lower_bound", -5.0, false);
  ReadLayers(f, layers, &config);
  return config;
}

// A KDA layer from the config: H heads of K, the lower-bound gate where the config sets one.
DeltaRuleGeometry KdaGeometry(const ModelConfig& c) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Kda(c.hidden_size, c.num_k_heads, c.head_k_dim, c.conv_size, c.rms_norm_eps);
  g.gate_lower_bound = static_cast<float>(c.gate_lower_bound.value_or(0.0));
  return g;
}

// GLM-5 Next keeps its conv1d in float32; Bailing also casts the activated gate to the activation dtype.
DeltaRuleGeometry Glm5NextSettings(DeltaRuleGeometry g) {
  g.conv_weights_f32 = true;
  return g;
}
// The real models' lower-bound gate, L = -5.
DeltaRuleGeometry BoundAtMinus5(DeltaRuleGeometry g) {
  g.gate_lower_bound = -5.0F;
  return g;
}
DeltaRuleGeometry BailingSettings(DeltaRuleGeometry g) {
  g.conv_weights_f32 = true;
  g.gate_in_act_dtype = true;
  return g;
}

// The layouts of a KDA layer's tensors (P = H*K; heads cut q/k/v, the convs, the gates' [P] rows, b, A_log,
// dt_bias and the output projection's input columns): q/k/v_proj [P, hidden], q/k/v_conv1d [P, 1, W] (rows of
// one conv1d), then the gates, then o_norm [K], the output projection [hidden, P], A_log, dt_bias [P], in the
// order a random model draws them. Kimi-Linear's (and GLM-5 Next's) gates are low-rank: f_a_proj [K, hidden],
// f_b_proj [P, K], b_proj [H, hidden], g_a_proj, g_b_proj; A_log [1, 1, H, 1] (or [H]); output o_proj.
// Bailing's are full-rank, f_proj and g_proj [P, hidden]; output dense.
TensorTable KdaTensors(const DeltaRuleGeometry& g, bool low_rank, const std::string& out_name) {
  const int64_t hid = g.hidden;
  const int64_t p = g.key_dim();
  const int64_t k = g.K;
  const int64_t h = g.H;
  TensorTable t = {
      Projection("q_proj.weight", p, hid, {{k, R::kQ}}, 0.02F),
      Projection("k_proj.weight", p, hid, {{k, R::kK}}, 0.02F),
      Projection("v_proj.weight", p, hid, {{k, R::kV}}, 0.02F),
      Conv("q_conv1d.weight", p, g.W, {{k, R::kQ}}, "conv1d"),
      Conv("k_conv1d.weight", p, g.W, {{k, R::kK}}, "conv1d"),
      Conv("v_conv1d.weight", p, g.W, {{k, R::kV}}, "conv1d"),
  };
  if (low_rank) {
    t.push_back(LowRankDown("f_a_proj.weight", k, hid, R::kGateDown, 0.02F));
    t.push_back(Projection("f_b_proj.weight", p, k, {{k, R::kGate}}, 0.1F));
    t.push_back(Projection("b_proj.weight", h, hid, {{1, R::kBeta}}, 0.05F));
    t.push_back(LowRankDown("g_a_proj.weight", k, hid, R::kOutGateDown, 0.02F));
    t.push_back(Projection("g_b_proj.weight", p, k, {{k, R::kOutGate}}, 0.1F));
  } else {
    t.push_back(Projection("f_proj.weight", p, hid, {{k, R::kGate}}, 0.02F));
    t.push_back(Projection("b_proj.weight", h, hid, {{1, R::kBeta}}, 0.05F));
    t.push_back(Projection("g_proj.weight", p, hid, {{k, R::kOutGate}}, 0.02F));
  }
  t.push_back(Norm("o_norm.weight", k));
  t.push_back(OutProj(out_name, hid, p, k));
  t.push_back(ALog({{1, 1, h, 1}, {h}}, 1));
  t.push_back(DtBias(p, k));
  return t;
}

TensorTable KimiTensors(const DeltaRuleGeometry& g) { return KdaTensors(g, /*low_rank=*/true, "o_proj.weight"); }

}  // namespace

ModelConfig ReadUntypedKimiLinear(const ConfigFields& fields) { return ReadKimiLinear(fields, /*typed=*/false); }

// Kimi-Linear-48B-A3B: hidden 2304, 32 heads of 128, conv 4, eps 1e-5.
LayerFamily KimiLinear() {
  return Family("KimiDeltaAttention", {{"kimi_linear"}}, "self_attn.", DeltaRuleGeometry::Kda(2304, 32, 128, 4, 1e-5),
                ReadKimiLinearTyped, KdaGeometry, KimiTensors,
                "One KDA layer of a Kimi-Linear checkpoint (model_type kimi_linear): a decay per key dimension, "
                "sigmoid output gate; H = HV heads of K = V dims.");
}

// GLM-5.3-Flash's linear layers: hidden 4096, 64 heads of 128, gate lower bound -5.
LayerFamily Glm5Next() {
  return Family(
      "Glm5NextTextLinearAttention",
      {{"glm5_next_text"}, {"glm5_next", ConfigNesting::kNestedOrFlat, {"glm5_next_text"}}}, "self_attn.",
      BoundAtMinus5(Glm5NextSettings(DeltaRuleGeometry::Kda(4096, 64, 128, 4, 1e-5))), ReadGlm5Next,
      [](const ModelConfig& c) { return Glm5NextSettings(KdaGeometry(c)); }, KimiTensors,
      "One KDA layer of a GLM-5 Next checkpoint (model types glm5_next, with the text model under text_config, and "
      "glm5_next_text; Kimi-Linear's tensors, the text model's layers also under model.language_model.): a decay "
      "per key dimension under the gate's lower bound L (linear_lower_bound, default -5: g = L * sigmoid(exp(A_log) "
      "* (f + dt_bias)); null: Kimi's softplus gate), sigmoid output gate; H = HV heads of K = V dims.");
}

// Bailing hybrid (Ling 2.5): hidden 2560, 32 heads of 128, the safe gate (lower bound -5).
LayerFamily BailingHybrid() {
  return Family(
      "BailingHybridDeltaAttention", {{"bailing_hybrid"}}, "attention.",
      BoundAtMinus5(BailingSettings(DeltaRuleGeometry::Kda(2560, 32, 128, 4, 1e-6))), ReadBailingHybrid,
      [](const ModelConfig& c) { return BailingSettings(KdaGeometry(c)); },
      [](const DeltaRuleGeometry& g) { return KdaTensors(g, /*low_rank=*/false, "dense.weight"); },
      "One KDA layer of a Bailing hybrid checkpoint (model_type bailing_hybrid; under attention., full-rank f_proj "
      "and g_proj, the output projection named dense): a decay per key dimension, with kda_safe_gate (the default) "
      "under the lower bound kda_lower_bound (-5) as GLM-5 Next's, the activated gate rounded to the layer's dtype; "
      "sigmoid output gate; H = HV heads of K = V dims.");
}

}  // namespace kda::families
