#include "kda/models/layer_family.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "kda/models/gated_delta_net.h"
#include "kda/models/kimi_delta_attention.h"

namespace kda {
namespace {

using MakeLayer = std::function<std::unique_ptr<DeltaRuleLayer>(int, const DeltaRuleGeometry&, const LayerWeights&,
                                                                DType, Communicator*, WeightFormat)>;

// The variant settings a family takes from its config (the rest are the family's own).
DeltaRuleGeometry KdaGeometry(const ModelConfig& c) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Kda(c.hidden_size, c.num_k_heads, c.head_k_dim, c.conv_size, c.rms_norm_eps);
  g.gate_lower_bound = static_cast<float>(c.gate_lower_bound.value_or(0.0));
  return g;
}

DeltaRuleGeometry GdnGeometry(const ModelConfig& c) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Gdn(c.hidden_size, c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim,
                                               c.conv_size, c.rms_norm_eps);
  if (c.output_gate_activation == "sigmoid") g.output_gate = GateActivation::kSigmoid;
  if (c.allow_neg_eigval) g.beta_scale = 2.0F;
  return g;
}

// The tensor tables by layout.
TensorTable TableOf(KdaLayout layout, const DeltaRuleGeometry& g) { return KimiDeltaAttentionTensors(g, layout); }
TensorTable TableOf(GdnLayout layout, const DeltaRuleGeometry& g) { return GatedDeltaNetTensors(layout, g); }

// Variant settings a layer class fixes whatever its config says (nullptr: none).
using FixedSettings = void (*)(DeltaRuleGeometry&);

// A family of layer class `Layer` (KimiDeltaAttention or GatedDeltaNet) with checkpoint layout `layout`: its
// geometry from the config (KdaGeometry or GdnGeometry) and `reference` (the real model's), both with `fixed`.
template <class Layer, class Layout>
LayerFamily Family(Layout layout, const std::string& layer_class, const std::vector<std::string>& model_types,
                   const std::string& prefix, DeltaRuleGeometry (*from_config)(const ModelConfig&),
                   DeltaRuleGeometry reference, FixedSettings fixed = nullptr) {
  if (fixed != nullptr) fixed(reference);
  return {.layer_class = layer_class,
          .model_types = model_types,
          .layer_prefix = prefix,
          .reference = reference,
          .geometry =
              [from_config, fixed](const ModelConfig& c) {
                DeltaRuleGeometry g = from_config(c);
                if (fixed != nullptr) fixed(g);
                return g;
              },
          .tensors = [layout](const DeltaRuleGeometry& g) { return TableOf(layout, g); },
          .make_layer = MakeLayer([layout](int id, const DeltaRuleGeometry& g, const LayerWeights& w, DType dt,
                                           Communicator* tp, WeightFormat f) -> std::unique_ptr<DeltaRuleLayer> {
            return std::make_unique<Layer>(layout, id, g, w, dt, tp, f);
          })};
}

// A KDA geometry with the lower-bound gate L (the real models' configs: -5).
DeltaRuleGeometry LowerBound(DeltaRuleGeometry g, float L) {
  g.gate_lower_bound = L;
  return g;
}

std::vector<LayerFamily> MakeFamilies() {
  const auto kda = DeltaRuleGeometry::Kda;
  const auto gdn = DeltaRuleGeometry::Gdn;
  // GLM-5 Next and Bailing keep their conv1d in float32; Bailing casts the gate to the activation dtype;
  // OLMo hybrid's gated norm has eps 1e-5 whatever rms_norm_eps says.
  const FixedSettings glm5 = [](DeltaRuleGeometry& g) { g.conv_weights_f32 = true; };
  const FixedSettings bailing = [](DeltaRuleGeometry& g) {
    g.conv_weights_f32 = true;
    g.gate_in_act_dtype = true;
  };
  const FixedSettings olmo = [](DeltaRuleGeometry& g) { g.rms_norm_eps = 1e-5; };
  DeltaRuleGeometry olmo_7b = gdn(3840, 30, 30, 96, 192, 4, 1e-5);
  olmo_7b.beta_scale = 2.0F;  // linear_allow_neg_eigval

  std::vector<LayerFamily> f;
  // Kimi-Linear-48B-A3B: hidden 2304, 32 heads of 128, conv 4, eps 1e-5.
  f.push_back(Family<KimiDeltaAttention>(KdaLayout::kKimi, "KimiDeltaAttention", {"kimi_linear"}, "self_attn.",
                                         KdaGeometry, kda(2304, 32, 128, 4, 1e-5)));
  // Qwen3-Next-80B-A3B's linear layers: hidden 2048, 16 key / 32 value heads of 128, conv 4.
  f.push_back(Family<GatedDeltaNet>(GdnLayout::kQwen3Next, "Qwen3NextGatedDeltaNet", {"qwen3_next"}, "linear_attn.",
                                    GdnGeometry, gdn(2048, 16, 32, 128, 128, 4, 1e-6)));
  // Qwen3.5-9B's: hidden 4096, 16 key / 32 value heads of 128, conv 4 (the MoE siblings share the layer).
  f.push_back(Family<GatedDeltaNet>(GdnLayout::kQwen3_5, "Qwen3_5GatedDeltaNet",
                                    {"qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe"}, "linear_attn.",
                                    GdnGeometry, gdn(4096, 16, 32, 128, 128, 4, 1e-6)));
  // GLM-5.3-Flash's linear layers: hidden 4096, 64 heads of 128, gate lower bound -5.
  f.push_back(Family<KimiDeltaAttention>(KdaLayout::kKimi, "Glm5NextTextLinearAttention",
                                         {"glm5_next_text", "glm5_next"}, "self_attn.", KdaGeometry,
                                         LowerBound(kda(4096, 64, 128, 4, 1e-5), -5.0F), glm5));
  // Bailing hybrid (Ling 2.5): hidden 2560, 32 heads of 128, the safe gate (lower bound -5).
  f.push_back(Family<KimiDeltaAttention>(KdaLayout::kBailing, "BailingHybridDeltaAttention", {"bailing_hybrid"},
                                         "attention.", KdaGeometry, LowerBound(kda(2560, 32, 128, 4, 1e-6), -5.0F),
                                         bailing));
  // Qwen4-Exp: Qwen3.5's layer with the output gate's activation from the config; hidden 2048, 16 / 32 x 128.
  f.push_back(Family<GatedDeltaNet>(GdnLayout::kQwen3_5, "Qwen4ExpTextGatedDeltaNet", {"qwen4_exp_text", "qwen4_exp"},
                                    "linear_attn.", GdnGeometry, gdn(2048, 16, 32, 128, 128, 4, 1e-6)));
  // OLMo hybrid 7B: hidden 3840, 30 key / 30 value heads, K 96, V 192, beta in [0, 2].
  f.push_back(Family<GatedDeltaNet>(GdnLayout::kOlmoHybrid, "OlmoHybridGatedDeltaNet", {"olmo_hybrid"}, "linear_attn.",
                                    GdnGeometry, olmo_7b, olmo));
  // Lara mini: hidden 1024, 8 key / 16 value heads of 128, one fused in_proj.
  f.push_back(Family<GatedDeltaNet>(GdnLayout::kLaraMini, "LaraMiniGatedDeltaNet", {"lara_mini"}, "linear_attn.",
                                    GdnGeometry, gdn(1024, 8, 16, 128, 128, 4, 1e-6)));
  return f;
}

}  // namespace

const std::vector<LayerFamily>& LayerFamilies() {
  static const std::vector<LayerFamily> families = MakeFamilies();
  return families;
}

std::string SupportedModelTypesList() {
  std::string s;
  for (const LayerFamily& f : LayerFamilies()) {
    for (const std::string& t : f.model_types) s += (s.empty() ? "" : ", ") + t;
  }
  return s;
}

const LayerFamily& LayerFamilyFor(const std::string& model_type) {
  for (const LayerFamily& f : LayerFamilies()) {
    for (const std::string& t : f.model_types) {
      if (t == model_type) return f;
    }
  }
  throw Error("unsupported model_type \"" + model_type + "\" (supported: " + SupportedModelTypesList() + ")");
}

}  // namespace kda
