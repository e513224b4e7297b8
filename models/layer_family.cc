#include "kda/models/layer_family.h"

#include <string>

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

// A geometry with some variant settings changed.
template <class Edit>
DeltaRuleGeometry With(DeltaRuleGeometry g, Edit edit) {
  edit(g);
  return g;
}

LayerFamily KdaFamily(KdaLayout layout, std::string layer_class, std::vector<std::string> model_types,
                      std::string prefix, DeltaRuleGeometry reference,
                      std::function<DeltaRuleGeometry(const ModelConfig&)> geometry) {
  return {.layer_class = std::move(layer_class),
          .model_types = std::move(model_types),
          .layer_prefix = std::move(prefix),
          .reference = reference,
          .geometry = std::move(geometry),
          .tensors = [layout](const DeltaRuleGeometry& g) { return KimiDeltaAttentionTensors(g, layout); },
          .make_layer = MakeLayer([layout](int id, const DeltaRuleGeometry& g, const LayerWeights& w, DType dt,
                                           Communicator* tp, WeightFormat f) -> std::unique_ptr<DeltaRuleLayer> {
            return std::make_unique<KimiDeltaAttention>(layout, id, g, w, dt, tp, f);
          })};
}

LayerFamily GdnFamily(GdnLayout layout, std::string layer_class, std::vector<std::string> model_types,
                      DeltaRuleGeometry reference,
                      std::function<DeltaRuleGeometry(const ModelConfig&)> geometry = GdnGeometry) {
  return {.layer_class = std::move(layer_class),
          .model_types = std::move(model_types),
          .layer_prefix = "linear_attn.",
          .reference = reference,
          .geometry = std::move(geometry),
          .tensors = [layout](const DeltaRuleGeometry& g) { return GatedDeltaNetTensors(layout, g); },
          .make_layer = MakeLayer([layout](int id, const DeltaRuleGeometry& g, const LayerWeights& w, DType dt,
                                           Communicator* tp, WeightFormat f) -> std::unique_ptr<DeltaRuleLayer> {
            return std::make_unique<GatedDeltaNet>(layout, id, g, w, dt, tp, f);
          })};
}

std::vector<LayerFamily> MakeFamilies() {
  // GLM-5 Next and Bailing keep their conv1d in float32; Bailing casts the gate to the activation dtype;
  // OLMo hybrid's gated norm has eps 1e-5 whatever rms_norm_eps says.
  const auto glm5 = [](DeltaRuleGeometry& g) { g.conv_weights_f32 = true; };
  const auto bailing = [](DeltaRuleGeometry& g) {
    g.conv_weights_f32 = true;
    g.gate_in_act_dtype = true;
  };
  const auto olmo = [](DeltaRuleGeometry& g) { g.rms_norm_eps = 1e-5; };
  const auto lower_bound = [](DeltaRuleGeometry& g) { g.gate_lower_bound = -5.0F; };
  const auto neg_eigval = [](DeltaRuleGeometry& g) { g.beta_scale = 2.0F; };

  std::vector<LayerFamily> f;
  // Kimi-Linear-48B-A3B: hidden 2304, 32 heads of 128, conv 4, eps 1e-5.
  f.push_back(KdaFamily(KdaLayout::kKimi, "KimiDeltaAttention", {"kimi_linear"}, "self_attn.",
                        DeltaRuleGeometry::Kda(2304, 32, 128, 4, 1e-5), KdaGeometry));
  // Qwen3-Next-80B-A3B's linear layers: hidden 2048, 16 key / 32 value heads of 128, conv 4.
  f.push_back(GdnFamily(GdnLayout::kQwen3Next, "Qwen3NextGatedDeltaNet", {"qwen3_next"},
                        DeltaRuleGeometry::Gdn(2048, 16, 32, 128, 128, 4, 1e-6)));
  // Qwen3.5-9B's: hidden 4096, 16 key / 32 value heads of 128, conv 4 (the MoE siblings share the layer).
  f.push_back(GdnFamily(GdnLayout::kQwen3_5, "Qwen3_5GatedDeltaNet",
                        {"qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe"},
                        DeltaRuleGeometry::Gdn(4096, 16, 32, 128, 128, 4, 1e-6)));
  // GLM-5.3-Flash's linear layers: hidden 4096, 64 heads of 128, gate lower bound -5.
  f.push_back(KdaFamily(KdaLayout::kKimi, "Glm5NextTextLinearAttention", {"glm5_next_text", "glm5_next"}, "self_attn.",
                        With(With(DeltaRuleGeometry::Kda(4096, 64, 128, 4, 1e-5), glm5), lower_bound),
                        [glm5](const ModelConfig& c) { return With(KdaGeometry(c), glm5); }));
  // Bailing hybrid (Ling-2.5): hidden 2560, 32 heads of 128, the safe gate (lower bound -5).
  f.push_back(KdaFamily(KdaLayout::kBailing, "BailingHybridDeltaAttention", {"bailing_hybrid"}, "attention.",
                        With(With(DeltaRuleGeometry::Kda(2560, 32, 128, 4, 1e-6), bailing), lower_bound),
                        [bailing](const ModelConfig& c) { return With(KdaGeometry(c), bailing); }));
  // Qwen4-Exp: Qwen3.5's layer with the output gate's activation from the config; hidden 2048, 16 / 32 x 128.
  f.push_back(GdnFamily(GdnLayout::kQwen3_5, "Qwen4ExpTextGatedDeltaNet", {"qwen4_exp_text", "qwen4_exp"},
                        DeltaRuleGeometry::Gdn(2048, 16, 32, 128, 128, 4, 1e-6)));
  // OLMo hybrid 7B: hidden 3840, 30 key / 30 value heads, K 96, V 192, beta in [0, 2].
  f.push_back(GdnFamily(GdnLayout::kOlmoHybrid, "OlmoHybridGatedDeltaNet", {"olmo_hybrid"},
                        With(With(DeltaRuleGeometry::Gdn(3840, 30, 30, 96, 192, 4, 1e-5), olmo), neg_eigval),
                        [olmo](const ModelConfig& c) { return With(GdnGeometry(c), olmo); }));
  // Lara mini: hidden 1024, 8 key / 16 value heads of 128, one fused in_proj.
  f.push_back(GdnFamily(GdnLayout::kLaraMini, "LaraMiniGatedDeltaNet", {"lara_mini"},
                        DeltaRuleGeometry::Gdn(1024, 8, 16, 128, 128, 4, 1e-6)));
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
