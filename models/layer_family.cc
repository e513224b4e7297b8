#include "kda/models/layer_family.h"

#include <string>

#include "kda/base/error.h"
#include "kda/models/gated_delta_net.h"
#include "kda/models/kimi_delta_attention.h"

namespace kda {
namespace {

DeltaRuleGeometry GdnGeometry(const ModelConfig& c) {
  return DeltaRuleGeometry::Gdn(c.hidden_size, c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim, c.conv_size,
                                c.rms_norm_eps);
}

LayerFamily GdnFamily(GdnLayout layout, std::string layer_class, std::vector<std::string> model_types,
                      DeltaRuleGeometry reference) {
  return {.layer_class = std::move(layer_class),
          .model_types = std::move(model_types),
          .layer_prefix = "linear_attn.",
          .reference = reference,
          .geometry = GdnGeometry,
          .tensors = [layout](const DeltaRuleGeometry& g) { return GatedDeltaNetTensors(layout, g); },
          .make_layer = [layout](int id, const DeltaRuleGeometry& g, const LayerWeights& w, DType dt, Communicator* tp,
                                 WeightFormat f) -> std::unique_ptr<DeltaRuleLayer> {
            return std::make_unique<GatedDeltaNet>(layout, id, g, w, dt, tp, f);
          }};
}

std::vector<LayerFamily> MakeFamilies() {
  std::vector<LayerFamily> f;
  // Kimi-Linear-48B-A3B: hidden 2304, 32 heads of 128, conv 4, eps 1e-5.
  f.push_back({.layer_class = "KimiDeltaAttention",
               .model_types = {"kimi_linear"},
               .layer_prefix = "self_attn.",
               .reference = DeltaRuleGeometry::Kda(2304, 32, 128, 4, 1e-5),
               .geometry =
                   [](const ModelConfig& c) {
                     return DeltaRuleGeometry::Kda(c.hidden_size, c.num_k_heads, c.head_k_dim, c.conv_size,
                                                   c.rms_norm_eps);
                   },
               .tensors = KimiDeltaAttentionTensors,
               .make_layer = [](int id, const DeltaRuleGeometry& g, const LayerWeights& w, DType dt, Communicator* tp,
                                WeightFormat fmt) -> std::unique_ptr<DeltaRuleLayer> {
                 return std::make_unique<KimiDeltaAttention>(id, g, w, dt, tp, fmt);
               }});
  // Qwen3-Next-80B-A3B's linear layers: hidden 2048, 16 key / 32 value heads of 128, conv 4.
  f.push_back(GdnFamily(GdnLayout::kQwen3Next, "Qwen3NextGatedDeltaNet", {"qwen3_next"},
                        DeltaRuleGeometry::Gdn(2048, 16, 32, 128, 128, 4, 1e-6)));
  // Qwen3.5-9B's: hidden 4096, 16 key / 32 value heads of 128, conv 4 (the MoE siblings share the layer).
  f.push_back(GdnFamily(GdnLayout::kQwen3_5, "Qwen3_5GatedDeltaNet",
                        {"qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe"},
                        DeltaRuleGeometry::Gdn(4096, 16, 32, 128, 128, 4, 1e-6)));
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
