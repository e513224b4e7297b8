// The Gated DeltaNet families (a decay per value head): Qwen3-Next, Qwen3.5 (and its MoE sibling), OLMo
// hybrid, Lara-Mini and Qwen4-exp, each an entry of the registry (kda/models/layer_family.h): its config
// reader (Qwen3-Next's field names, each type's defaults as its transformers 5.25 config class has them),
// geometry, tensor table and reference layer.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config_fields.h"
#include "io/util.h"
#include "kda/base/error.h"
#include "models/families/families.h"

namespace kda::families {
namespace {

using io_internal::ConfigFields;
using io_internal::Contains;
using io_internal::Describe;
using io_internal::EveryPeriodthFull;
using io_internal::kInt64Max;
using io_internal::kIntMax;
using io_internal::LayerRule;
using io_internal::QuotedAlternatives;
using io_internal::ReadLayers;
using io_internal::ReadSizes;
using nlohmann::json;
using R = TensorRole;

// The model types' layer rules, as their transformers 5.25 config classes read layer_types.
const LayerRule& QwenLayers() {  // qwen3_next, qwen3_5*: Qwen3NextConfig / Qwen3_5TextConfig
  static const LayerRule rule{{"full_attention"}, "full_attention_interval", 4, EveryPeriodthFull, nullptr, false};
  return rule;
}
const LayerRule& Qwen4ExpLayers() {  // full_attention is read as indexed_attention
  static const LayerRule rule{
      {"full_attention", "indexed_attention"}, "full_attention_interval", 4, EveryPeriodthFull, nullptr, false};
  return rule;
}
const LayerRule& OlmoHybridLayers() {  // OlmoHybridConfig also refuses a list without an attention layer
  static const LayerRule rule{
      {"full_attention"},
      nullptr,
      0,
      [](int64_t layer, int64_t layers, int64_t /*period*/) {
        return layer % 4 != 3 && !(layers < 4 && layer == layers - 1);
      },
      "the implied list (every 4th layer full attention, and the last one when that makes none)",
      true};
  return rule;
}
const LayerRule& LaraMiniLayers() {  // the released period-5 pattern: linear, sliding, linear, full, sliding
  static const LayerRule rule{
      {"full_attention", "sliding_attention"},
      nullptr,
      0,
      [](int64_t layer, int64_t /*layers*/, int64_t /*period*/) { return layer % 5 == 0 || layer % 5 == 2; },
      "the implied list (linear, sliding, linear, full, sliding attention, repeated)",
      false};
  return rule;
}

// A Gated DeltaNet model type whose fields follow Qwen3-Next's names (linear_num_key_heads,
// linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim), with its defaults.
struct GdnSpec {
  std::array<int64_t, 4> heads;  // the four head fields' defaults in that order; 0: required
  bool derived_heads;            // olmo_hybrid: absent or null head fields derive from others (OlmoHeadDefault)
  double rms_norm_eps;
  const LayerRule& (*layers)();
  void (*extra)(const ConfigFields&, ModelConfig*);  // the type's own fields, or nullptr
};

constexpr std::array<const char*, 4> kGdnHeadFields = {"linear_num_key_heads", "linear_num_value_heads",
                                                       "linear_key_head_dim", "linear_value_head_dim"};

// OlmoHybridConfig's defaults: the head counts num_attention_heads (default 30), the key dim
// int(0.75 * hidden_size / linear_num_key_heads), the value dim twice the key dim.
int64_t OlmoHeadDefault(const ConfigFields& f, size_t field, const ModelConfig& config) {
  if (field < 2) return f.IntOr("num_attention_heads", 30);
  const bool key = field == 2;
  const double value =
      key ? 0.75 * static_cast<double>(config.hidden_size) / config.num_k_heads : 2.0 * config.head_k_dim;
  f.Expect(value >= 1 && value <= kIntMax,
           f.Name(kGdnHeadFields[field]) + " is not given, and its default " +
               (key ? "int(0.75 * hidden_size / linear_num_key_heads)" : "2 * linear_key_head_dim") + " = " +
               std::to_string(static_cast<int64_t>(std::min(value, static_cast<double>(kInt64Max)))) +
               " is not a positive integer (at most " + std::to_string(kIntMax) + ")");
  return static_cast<int64_t>(value);
}

ModelConfig ReadGatedDeltaNet(const ConfigFields& f, const GdnSpec& spec) {
  ModelConfig config = ReadSizes(f, spec.rms_norm_eps);
  const std::array<int*, 4> heads = {&config.num_k_heads, &config.num_v_heads, &config.head_k_dim, &config.head_v_dim};
  for (size_t i = 0; i < heads.size(); ++i) {
    const char* key = kGdnHeadFields[i];
    if (const json* value = f.Find(key, /*null_is_absent=*/spec.derived_heads)) {
      *heads[i] = static_cast<int>(f.PositiveInt(*value, key, kIntMax));
    } else if (spec.derived_heads) {
      *heads[i] = static_cast<int>(OlmoHeadDefault(f, i, config));
    } else {
      f.Expect(spec.heads[i] != 0, "missing " + f.Name(key));
      *heads[i] = static_cast<int>(spec.heads[i]);
    }
    if (i == 1) {
      f.Expect(config.num_v_heads % config.num_k_heads == 0,
               f.Name("linear_num_value_heads") + " (" + std::to_string(config.num_v_heads) +
                   ") must be a multiple of " + f.Name("linear_num_key_heads") + " (" +
                   std::to_string(config.num_k_heads) + ")");
    }
  }
  config.conv_size = static_cast<int>(f.IntOr("linear_conv_kernel_dim", 4));
  if (spec.extra != nullptr) spec.extra(f, &config);
  ReadLayers(f, spec.layers(), &config);
  return config;
}

// olmo_hybrid: beta = 2 * sigmoid(b) unless linear_allow_neg_eigval is false.
void ReadOlmoHybridFields(const ConfigFields& f, ModelConfig* config) {
  config->allow_neg_eigval = f.BoolOr("linear_allow_neg_eigval", true);
}

// qwen4_exp: the output gate's activation, output_gate_type or (null, absent or "", as transformers' `or` reads
// it) hidden_act (default "silu").
void ReadQwen4ExpFields(const ConfigFields& f, ModelConfig* config) {
  const std::vector<std::string> accepted = {"sigmoid", "silu"};
  const std::string gate = f.StringOr("output_gate_type", "", /*nullable=*/true).value_or("");
  const char* key = gate.empty() ? "hidden_act" : "output_gate_type";
  const std::string activation = gate.empty() ? *f.StringOr("hidden_act", "silu", /*nullable=*/false) : gate;
  f.Expect(Contains(accepted, activation),
           f.Name(key) + " must be " + QuotedAlternatives(accepted) +
               (gate.empty() ? " (the output gate's activation when output_gate_type is unset)" : "") + ", got " +
               Describe(json(activation)));
  config->output_gate_activation = activation;
}

constexpr GdnSpec kQwenGdn{{0, 0, 0, 0}, false, 1e-6, QwenLayers, nullptr};
constexpr GdnSpec kQwen4Exp{{16, 32, 128, 128}, false, 1e-6, Qwen4ExpLayers, ReadQwen4ExpFields};
constexpr GdnSpec kLaraMini{{8, 16, 128, 128}, false, 1e-6, LaraMiniLayers, nullptr};
constexpr GdnSpec kOlmoHybrid{{0, 0, 0, 0}, true, 1e-6, OlmoHybridLayers, ReadOlmoHybridFields};

template <const GdnSpec& kSpec>
ModelConfig ReadGdn(const ConfigFields& f) {
  return ReadGatedDeltaNet(f, kSpec);
}

// A Gated DeltaNet layer from the config: the output gate's activation and beta's range where it sets them.
DeltaRuleGeometry GdnGeometry(const ModelConfig& c) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Gdn(c.hidden_size, c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim,
                                               c.conv_size, c.rms_norm_eps);
  if (c.output_gate_activation == "sigmoid") g.output_gate = GateActivation::kSigmoid;
  if (c.allow_neg_eigval) g.beta_scale = 2.0F;
  return g;
}

// The row counts of a Gated DeltaNet layout's parts: per key head K (q, k) and r value heads (r rows of b
// and a, rV of v and z); over all heads H*K and HV*V.
struct Rows {
  explicit Rows(const DeltaRuleGeometry& g)
      : k(g.K), r(g.group()), rv(int64_t{g.group()} * g.V), kd(g.key_dim()), vd(g.value_dim()) {}
  int64_t k, r, rv, kd, vd;
};

// The tensors every Gated DeltaNet layout ends with (key heads cut every projection's rows, a value head with
// its key head, the conv's channels, A_log, dt_bias and the output projection's input columns; the norm is
// replicated): the conv1d over q|k|v [C, 1, W] unless the layout keeps the convs apart, A_log and dt_bias [HV],
// the gated norm [V], the output projection [hidden, HV*V].
void AddGdnCore(TensorTable& t, const DeltaRuleGeometry& g, bool conv1d, const std::string& norm,
                const std::string& out) {
  const Rows n(g);
  if (conv1d) t.push_back(Conv("conv1d.weight", g.conv_channels(), g.W, {{n.k, R::kQ}, {n.k, R::kK}, {n.rv, R::kV}}));
  t.push_back(ALog({{g.HV}}, n.r));
  t.push_back(DtBias(g.HV, n.r));
  t.push_back(Norm(norm, g.V));
  t.push_back(OutProj(out, g.hidden, n.vd, n.rv));
}

// Qwen3-Next: in_proj_qkvz [H*(2K + 2rV), hidden], rows per key-head group i [q_i (K), k_i (K), v_i (rV),
// z_i (rV)]; in_proj_ba [2*HV, hidden], rows per group [b_i (r), a_i (r)].
TensorTable Qwen3NextTensors(const DeltaRuleGeometry& g) {
  const Rows n(g);
  TensorTable t = {
      Projection("in_proj_qkvz.weight", g.conv_channels() + n.vd, g.hidden,
                 {{n.k, R::kQ}, {n.k, R::kK}, {n.rv, R::kV}, {n.rv, R::kOutGate}}, 0.02F, /*interleaved=*/true),
      Projection("in_proj_ba.weight", 2 * int64_t{g.HV}, g.hidden, {{n.r, R::kBeta}, {n.r, R::kGate}}, 0.05F,
                 /*interleaved=*/true),
  };
  AddGdnCore(t, g, /*conv1d=*/true, "norm.weight", "out_proj.weight");
  return t;
}

// Qwen3.5 (also Qwen4-exp): in_proj_qkv [C, hidden] (q|k|v), in_proj_z [HV*V, hidden], in_proj_b and
// in_proj_a [HV, hidden].
TensorTable Qwen3_5Tensors(const DeltaRuleGeometry& g) {
  const Rows n(g);
  TensorTable t = {
      Projection("in_proj_qkv.weight", g.conv_channels(), g.hidden, {{n.k, R::kQ}, {n.k, R::kK}, {n.rv, R::kV}}, 0.02F),
      Projection("in_proj_z.weight", n.vd, g.hidden, {{n.rv, R::kOutGate}}, 0.02F),
      Projection("in_proj_b.weight", g.HV, g.hidden, {{n.r, R::kBeta}}, 0.05F),
      Projection("in_proj_a.weight", g.HV, g.hidden, {{n.r, R::kGate}}, 0.05F),
  };
  AddGdnCore(t, g, /*conv1d=*/true, "norm.weight", "out_proj.weight");
  return t;
}

// OLMo hybrid: q_proj, k_proj [H*K, hidden], v_proj [HV*V, hidden], a_proj, b_proj [HV, hidden], g_proj (the
// output gate) [HV*V, hidden]; the convs apart, q_conv1d, k_conv1d [H*K, 1, W] and v_conv1d [HV*V, 1, W] (rows
// of one conv1d); norm o_norm, output projection o_proj.
TensorTable OlmoHybridTensors(const DeltaRuleGeometry& g) {
  const Rows n(g);
  TensorTable t = {
      Projection("q_proj.weight", n.kd, g.hidden, {{n.k, R::kQ}}, 0.02F),
      Projection("k_proj.weight", n.kd, g.hidden, {{n.k, R::kK}}, 0.02F),
      Projection("v_proj.weight", n.vd, g.hidden, {{n.rv, R::kV}}, 0.02F),
      Projection("a_proj.weight", g.HV, g.hidden, {{n.r, R::kGate}}, 0.05F),
      Projection("b_proj.weight", g.HV, g.hidden, {{n.r, R::kBeta}}, 0.05F),
      Projection("g_proj.weight", n.vd, g.hidden, {{n.rv, R::kOutGate}}, 0.02F),
      Conv("q_conv1d.weight", n.kd, g.W, {{n.k, R::kQ}}, "conv1d"),
      Conv("k_conv1d.weight", n.kd, g.W, {{n.k, R::kK}}, "conv1d"),
      Conv("v_conv1d.weight", n.vd, g.W, {{n.rv, R::kV}}, "conv1d"),
  };
  AddGdnCore(t, g, /*conv1d=*/false, "o_norm.weight", "o_proj.weight");
  return t;
}

// Lara-Mini: one in_proj [C + HV*V + 2*HV, hidden], rows q|k|v|z|b|a; the norm named out_norm.
TensorTable LaraMiniTensors(const DeltaRuleGeometry& g) {
  const Rows n(g);
  TensorTable t = {
      Projection("in_proj.weight", g.conv_channels() + n.vd + 2 * int64_t{g.HV}, g.hidden,
                 {{n.k, R::kQ}, {n.k, R::kK}, {n.rv, R::kV}, {n.rv, R::kOutGate}, {n.r, R::kBeta}, {n.r, R::kGate}},
                 0.02F),
  };
  AddGdnCore(t, g, /*conv1d=*/true, "out_norm.weight", "out_proj.weight");
  return t;
}

}  // namespace

// Qwen3-Next-80B-A3B's linear layers: hidden 2048, 16 key / 32 value heads of 128, conv 4.
LayerFamily Qwen3Next() {
  return Family("Qwen3NextGatedDeltaNet", {{"qwen3_next"}}, "linear_attn.",
                DeltaRuleGeometry::Gdn(2048, 16, 32, 128, 128, 4, 1e-6), ReadGdn<kQwenGdn>, GdnGeometry,
                Qwen3NextTensors,
                "One Gated DeltaNet layer of a Qwen3-Next checkpoint (model_type qwen3_next; in_proj_qkvz and "
                "in_proj_ba interleaved per key-head group): a decay per value head, silu output gate.");
}

// Qwen3.5-9B's: hidden 4096, 16 key / 32 value heads of 128, conv 4 (the MoE siblings share the layer).
LayerFamily Qwen3_5() {
  const std::vector<std::string> text = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};
  return Family("Qwen3_5GatedDeltaNet",
                {{"qwen3_5_text"},
                 {"qwen3_5", ConfigNesting::kNested, text},
                 {"qwen3_5_moe_text"},
                 {"qwen3_5_moe", ConfigNesting::kNested, text}},
                "linear_attn.", DeltaRuleGeometry::Gdn(4096, 16, 32, 128, 128, 4, 1e-6), ReadGdn<kQwenGdn>, GdnGeometry,
                Qwen3_5Tensors,
                "One Gated DeltaNet layer of a Qwen3.5 checkpoint (model types qwen3_5, qwen3_5_text, qwen3_5_moe, "
                "qwen3_5_moe_text; in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; the text model's layers also "
                "under model.language_model.): a decay per value head, silu output gate.");
}

// OLMo hybrid 7B: hidden 3840, 30 key / 30 value heads, K 96, V 192, beta in [0, 2]; the gated norm's eps 1e-5
// whatever rms_norm_eps says.
LayerFamily OlmoHybrid() {
  DeltaRuleGeometry reference = DeltaRuleGeometry::Gdn(3840, 30, 30, 96, 192, 4, 1e-5);
  reference.beta_scale = 2.0F;  // linear_allow_neg_eigval
  const auto geometry = [](const ModelConfig& c) {
    DeltaRuleGeometry g = GdnGeometry(c);
    g.rms_norm_eps = 1e-5;
    return g;
  };
  return Family("OlmoHybridGatedDeltaNet", {{"olmo_hybrid"}}, "linear_attn.", reference, ReadGdn<kOlmoHybrid>, geometry,
                OlmoHybridTensors,
                "One Gated DeltaNet layer of an OLMo hybrid checkpoint (model_type olmo_hybrid; separate q_proj, "
                "k_proj, v_proj, a_proj, b_proj, g_proj and q/k/v convs): a decay per value head, beta = 2 * "
                "sigmoid(b) (negative eigenvalues, linear_allow_neg_eigval, the default; else sigmoid(b)), silu "
                "output gate from g_proj, the norm's eps 1e-5 whatever rms_norm_eps says.");
}

// Lara mini: hidden 1024, 8 key / 16 value heads of 128, one fused in_proj.
LayerFamily LaraMini() {
  return Family("LaraMiniGatedDeltaNet", {{"lara_mini"}}, "linear_attn.",
                DeltaRuleGeometry::Gdn(1024, 8, 16, 128, 128, 4, 1e-6), ReadGdn<kLaraMini>, GdnGeometry,
                LaraMiniTensors,
                "One Gated DeltaNet layer of a Lara-Mini checkpoint (model_type lara_mini; one fused in_proj, rows "
                "q|k|v|z|b|a, and the gated norm named out_norm): Qwen3.5's layer, a decay per value head, silu "
                "output gate.");
}

// Qwen4-Exp: Qwen3.5's layer with the output gate's activation from the config; hidden 2048, 16 / 32 x 128.
LayerFamily Qwen4Exp() {
  return Family("Qwen4ExpTextGatedDeltaNet",
                {{"qwen4_exp_text"}, {"qwen4_exp", ConfigNesting::kNested, {"qwen4_exp_text"}}}, "linear_attn.",
                DeltaRuleGeometry::Gdn(2048, 16, 32, 128, 128, 4, 1e-6), ReadGdn<kQwen4Exp>, GdnGeometry,
                Qwen3_5Tensors,
                "One Gated DeltaNet layer of a Qwen4-exp checkpoint (model types qwen4_exp, with the text model "
                "under text_config, and qwen4_exp_text; Qwen3.5's tensors, the text model's layers also under "
                "model.language_model.): a decay per value head, the output gate's activation output_gate_type "
                "(\"sigmoid\" or \"silu\"; unset: hidden_act).");
}

}  // namespace kda::families
