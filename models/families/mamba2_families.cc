// The Mamba2 mixer families (the SSD layer, DeltaRuleGeometry::ssd): Mamba2 (Codestral Mamba), Nemotron-H,
// Granite-4.0-H (granitemoehybrid), Bamba, Falcon-H1 and Zamba2, each an entry of the registry
// (kda/models/layer_family.h): its config reader (the field names and defaults of its transformers 5.25 config
// class), geometry, tensor table and reference layer. One checkpoint layout serves all six: in_proj [2I + 2GN + H,
// hidden] (rows z | x | B | C | dt), conv1d [I + 2GN, 1, W] with its bias (channels x | B | C), dt_bias, A_log and D
// [H], the gated norm [I] (none in a Falcon-H1 mixer without mamba_rms_norm), out_proj [hidden, I]; I = H P, G groups
// of B and C of state size N.
#include <array>
#include <cmath>
#include <limits>
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
using io_internal::Describe;
using io_internal::kIntMax;
using io_internal::kMaxImpliedLayers;
using nlohmann::json;
using R = TensorRole;

// A model type's mixer fields: their names in its config class and their defaults.
struct MixerSpec {
  const char* heads;
  int64_t heads_default;
  const char* head_dim;
  int64_t head_dim_default;  // 0: "auto" (I / heads, I = expand * hidden) where the field is absent or "auto"
  const char* state;
  int64_t state_default;
  const char* groups;
  int64_t groups_default;
  const char* conv;
  const char* expand;  // null: not read (nemotron_h: I = heads * head_dim)
  const char* eps;
  double eps_default;
  const char* conv_bias;
  const char* proj_bias;
  const char* act;
  // Older names the config class still takes, each winning over the field where present (nemotron_h's
  // mamba_n_groups, mamba_d_conv, mamba_conv_bias, mamba_dt_limit); null: none.
  const char* legacy_groups = nullptr;
  const char* legacy_conv = nullptr;
  const char* legacy_conv_bias = nullptr;
  const char* legacy_limit = nullptr;
  // Falcon-H1: I from `inner` (mamba_d_ssm; absent: inner_default, null: expand * hidden), no out_proj bias
  // (`out_bias`). Zamba2: no eps, conv-bias or
  // activation field (null `eps`, `conv_bias`, `act`: 1e-5, a bias, silu), the clamp (`dt_min`, inf) from
  // its field instead of time_step_limit.
  const char* inner = nullptr;
  int64_t inner_default = 0;
  const char* out_bias = nullptr;
  const char* dt_min = nullptr;
};

// `legacy` where the config has it (not null), else `key`.
const char* Field(const ConfigFields& f, const char* legacy, const char* key) {
  return legacy != nullptr && f.Find(legacy, /*null_is_absent=*/true) != nullptr ? legacy : key;
}

// The mixer layers of a layer list whose entries name each layer: "mamba" or "linear_attention" (a mixer),
// or one of `others` (mixers too where `others_are_mixers`: Zamba2's "hybrid").
void MixerLayers(const ConfigFields& f, const char* key, const json& list, const std::vector<std::string>& others,
                 ModelConfig* config, bool others_are_mixers = false) {
  f.Expect(list.is_array() && !list.empty() && static_cast<int64_t>(list.size()) <= kMaxImpliedLayers,
           f.Name(key) + " must be a non-empty array of layer types");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const bool mixer = e.is_string() && (e == "mamba" || e == "linear_attention");
    bool other = false;
    for (const std::string& o : others) other = other || (e.is_string() && e == o);
    f.Expect(mixer || other, f.Name(key) + " entry " + std::to_string(i) + " is " + Describe(e) +
                                 ", not \"mamba\", \"linear_attention\" or another layer type of the model");
    if (mixer || others_are_mixers) config->linear_layers.push_back(static_cast<int>(i));
  }
  f.Expect(!config->linear_layers.empty(), f.Name(key) + " has no mamba layer");
}

ModelConfig ReadMixer(const ConfigFields& f, const MixerSpec& s, ModelConfig config) {
  config.ssd = true;
  const auto int_field = [&](const char* key, int64_t fallback) {
    if (const json* v = f.Find(key, /*null_is_absent=*/true)) return f.PositiveInt(*v, key, kIntMax);
    f.Expect(fallback > 0, "missing " + f.Name(key));
    return fallback;
  };
  config.num_v_heads = static_cast<int>(int_field(s.heads, s.heads_default));
  config.num_k_heads = static_cast<int>(int_field(Field(f, s.legacy_groups, s.groups), s.groups_default));
  config.head_k_dim = static_cast<int>(int_field(s.state, s.state_default));
  config.conv_size = static_cast<int>(int_field(Field(f, s.legacy_conv, s.conv), 4));
  const int64_t expand = s.expand != nullptr ? int_field(s.expand, 2) : 0;
  int64_t inner = expand * config.hidden_size;
  std::string inner_name = s.expand != nullptr ? f.Name(s.expand) + " * hidden_size" : "";
  if (s.inner != nullptr) {
    const json* d = f.Find(s.inner);
    if (d == nullptr || !d->is_null()) {
      inner = d == nullptr ? s.inner_default : f.PositiveInt(*d, s.inner, kIntMax);
      inner_name = f.Name(s.inner);
    }
  }
  const json* head_dim = f.Find(s.head_dim, /*null_is_absent=*/true);
  if (s.head_dim_default == 0 && (head_dim == nullptr || (head_dim->is_string() && *head_dim == "auto"))) {
    f.Expect(inner % config.num_v_heads == 0, f.Name(s.head_dim) + " is \"auto\", but " + inner_name + " = " +
                                                  std::to_string(inner) + " is not a multiple of " + f.Name(s.heads));
    config.head_v_dim = static_cast<int>(inner / config.num_v_heads);
  } else {
    config.head_v_dim = static_cast<int>(int_field(s.head_dim, s.head_dim_default));
  }
  if (s.expand != nullptr) {
    f.Expect(inner == int64_t{config.num_v_heads} * config.head_v_dim,
             inner_name + " (" + std::to_string(inner) + ") must equal " + f.Name(s.heads) + " * " +
                 f.Name(s.head_dim) + " (" + std::to_string(int64_t{config.num_v_heads} * config.head_v_dim) + ")");
  }
  f.Expect(config.num_v_heads % config.num_k_heads == 0,
           f.Name(s.heads) + " (" + std::to_string(config.num_v_heads) + ") must be a multiple of " +
               f.Name(Field(f, s.legacy_groups, s.groups)) + " (" + std::to_string(config.num_k_heads) + ")");
  config.rms_norm_eps = s.eps_default;
  if (const json* eps = s.eps != nullptr ? f.Find(s.eps, /*null_is_absent=*/true) : nullptr) {
    f.Expect(eps->is_number() && std::isfinite(eps->get<double>()) && eps->get<double>() > 0,
             f.Name(s.eps) + " must be a finite number > 0, got " + Describe(*eps));
    config.rms_norm_eps = eps->get<double>();
  }
  if (s.conv_bias != nullptr) {
    const char* conv_bias = Field(f, s.legacy_conv_bias, s.conv_bias);
    f.Expect(f.BoolOr(conv_bias, true), f.Name(conv_bias) + " false (a conv without bias) is not supported");
  }
  f.Expect(!f.BoolOr(s.proj_bias, false), f.Name(s.proj_bias) + " true (biased in_proj and out_proj) is not supported");
  if (s.out_bias != nullptr) {
    f.Expect(!f.BoolOr(s.out_bias, false), f.Name(s.out_bias) + " true (a biased out_proj) is not supported");
  }
  if (s.act != nullptr) {
    const std::string act = f.StringOr(s.act, "silu", /*nullable=*/true).value_or("silu");
    f.Expect(act == "silu" || act == "swish",
             f.Name(s.act) + " must be \"silu\" (the conv's activation), got " + Describe(json(act)));
  }
  if (s.dt_min != nullptr) {  // (dt_min, inf): Zamba2's fixed clamp
    const json* lo = f.Find(s.dt_min, /*null_is_absent=*/true);
    config.dt_min = lo != nullptr && lo->is_number() ? lo->get<double>() : 1e-3;
    f.Expect(
        lo == nullptr || (lo->is_number() && config.dt_min >= 0 && config.dt_min <= std::numeric_limits<float>::max()),
        f.Name(s.dt_min) + " must be a finite number >= 0, got " + (lo != nullptr ? Describe(*lo) : ""));
    return config;
  }
  // [min, max]: max may be Infinity (the config classes' default, (0.0, inf)), min must be finite (as a float).
  const char* limit_key = Field(f, s.legacy_limit, "time_step_limit");
  if (const json* limit = f.Find(limit_key, /*null_is_absent=*/true)) {
    f.Expect(limit->is_array() && limit->size() == 2 && (*limit)[0].is_number() && (*limit)[1].is_number(),
             f.Name(limit_key) + " must be [min, max], got " + Describe(*limit));
    config.dt_min = (*limit)[0].get<double>();
    config.dt_max = (*limit)[1].get<double>();
    f.Expect(config.dt_min >= 0 && config.dt_min <= std::numeric_limits<float>::max() && config.dt_min <= config.dt_max,
             f.Name(limit_key) + " must satisfy 0 <= min <= max (min finite), got " + Describe(*limit));
  }
  return config;
}

// hidden_size and num_hidden_layers (required) and the mixer fields; the layers are the reader's.
ModelConfig ReadSized(const ConfigFields& f, const MixerSpec& s) {
  return ReadMixer(f, s, io_internal::ReadSizes(f, s.eps_default));
}

constexpr MixerSpec kMamba2{"num_heads",     128,        "head_dim",    64,       "state_size",         128,
                            "n_groups",      8,          "conv_kernel", "expand", "layer_norm_epsilon", 1e-5,
                            "use_conv_bias", "use_bias", "hidden_act"};
constexpr MixerSpec kNemotronH{"mamba_num_heads",    128,
                               "mamba_head_dim",     64,
                               "ssm_state_size",     128,
                               "n_groups",           8,
                               "conv_kernel",        nullptr,
                               "layer_norm_epsilon", 1e-5,
                               "use_conv_bias",      "use_bias",
                               "mamba_hidden_act",   "mamba_n_groups",
                               "mamba_d_conv",       "mamba_conv_bias",
                               "mamba_dt_limit"};
constexpr MixerSpec kGranite{"mamba_n_heads",   128,
                             "mamba_d_head",    0,
                             "mamba_d_state",   256,
                             "mamba_n_groups",  1,
                             "mamba_d_conv",    "mamba_expand",
                             "rms_norm_eps",    1e-6,
                             "mamba_conv_bias", "mamba_proj_bias",
                             "hidden_act"};
constexpr MixerSpec kBamba{"mamba_n_heads",   128,
                           "mamba_d_head",    0,
                           "mamba_d_state",   256,
                           "mamba_n_groups",  1,
                           "mamba_d_conv",    "mamba_expand",
                           "rms_norm_eps",    1e-5,
                           "mamba_conv_bias", "mamba_proj_bias",
                           "hidden_act"};

// Falcon-H1: Bamba's names, I from mamba_d_ssm (default 1024), no out_proj bias (projectors_bias).
constexpr MixerSpec FalconH1Spec() {
  MixerSpec s = kBamba;
  s.inner = "mamba_d_ssm";
  s.inner_default = 1024;
  s.out_bias = "projectors_bias";
  return s;
}
constexpr MixerSpec kFalconH1 = FalconH1Spec();
// Zamba2: the head dim is derived (I / n_mamba_heads; a written mamba_headdim must agree), eps 1e-5, the conv
// bias and SiLU fixed, the clamp (time_step_min, inf).
constexpr MixerSpec kZamba2{.heads = "n_mamba_heads",
                            .heads_default = 8,
                            .head_dim = "mamba_headdim",
                            .head_dim_default = 0,
                            .state = "mamba_d_state",
                            .state_default = 64,
                            .groups = "mamba_ngroups",
                            .groups_default = 1,
                            .conv = "mamba_d_conv",
                            .expand = "mamba_expand",
                            .eps = nullptr,
                            .eps_default = 1e-5,
                            .conv_bias = nullptr,
                            .proj_bias = "add_bias_linear",
                            .act = nullptr,
                            .dt_min = "time_step_min"};

// mamba2: every layer a mixer.
ModelConfig ReadMamba2(const ConfigFields& f) {
  ModelConfig c = ReadSized(f, kMamba2);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.linear_layers.push_back(static_cast<int>(i));
  return c;
}

// nemotron_h: the layers from layer_types (the config's alias of layers_block_type, winning over it as in
// transformers) or layers_block_type ("mamba" / "linear_attention" the mixers), else from
// hybrid_override_pattern ('M' the mixers; '*' attention, '-' MLP, 'E' MoE); their count is the list's
// (transformers ignores a num_hidden_layers that differs).
ModelConfig ReadNemotronH(const ConfigFields& f) {
  ModelConfig c;
  c.hidden_size = f.RequireInt("hidden_size", io_internal::kInt64Max);
  const std::vector<std::string> others = {"attention", "full_attention", "mlp", "moe"};
  const char* list_key = Field(f, "layer_types", "layers_block_type");
  if (const json* list = f.Find(list_key, /*null_is_absent=*/true)) {
    MixerLayers(f, list_key, *list, others, &c);
    c.num_hidden_layers = static_cast<int64_t>(list->size());
  } else {
    const json* pattern = f.Find("hybrid_override_pattern", /*null_is_absent=*/true);
    f.Expect(pattern != nullptr, "missing " + f.Name("layers_block_type") + " (or " +
                                     f.Name("hybrid_override_pattern") + "): the layer pattern");
    f.Expect(pattern->is_string() && !pattern->get_ref<const std::string&>().empty() &&
                 static_cast<int64_t>(pattern->get_ref<const std::string&>().size()) <= kMaxImpliedLayers,
             f.Name("hybrid_override_pattern") + " must be a non-empty string, got " + Describe(*pattern));
    const std::string& p = pattern->get_ref<const std::string&>();
    for (size_t i = 0; i < p.size(); ++i) {
      f.Expect(p[i] == 'M' || p[i] == '*' || p[i] == '-' || p[i] == 'E',
               f.Name("hybrid_override_pattern") + " character " + std::to_string(i) + " is '" + p.substr(i, 1) +
                   "', not M (mamba), * (attention), - (MLP) or E (MoE)");
      if (p[i] == 'M') c.linear_layers.push_back(static_cast<int>(i));
    }
    f.Expect(!c.linear_layers.empty(), f.Name("hybrid_override_pattern") + " has no mamba layer (M)");
    c.num_hidden_layers = static_cast<int64_t>(p.size());
  }
  return ReadMixer(f, kNemotronH, c);
}

// granitemoehybrid: layers_block_type (the config's alias of layer_types, winning over it as in transformers) or
// layer_types ("mamba" / "linear_attention" the mixers, "attention" / "full_attention" not); without either every
// layer is a mixer.
ModelConfig ReadGranite(const ConfigFields& f) {
  ModelConfig c = ReadSized(f, kGranite);
  const char* key = Field(f, "layers_block_type", "layer_types");
  if (const json* types = f.Find(key, /*null_is_absent=*/true)) {
    f.Expect(types->is_array() && static_cast<int64_t>(types->size()) == c.num_hidden_layers,
             f.Name(key) + " must have num_hidden_layers (" + std::to_string(c.num_hidden_layers) + ") entries");
    MixerLayers(f, key, *types, {"attention", "full_attention"}, &c);
  } else {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.linear_layers.push_back(static_cast<int>(i));
  }
  return c;
}

// bamba: the layers not in attn_layer_indices are mixers.
ModelConfig ReadBamba(const ConfigFields& f) {
  ModelConfig c = ReadSized(f, kBamba);
  std::vector<bool> attention(static_cast<size_t>(c.num_hidden_layers), false);
  if (const json* idx = f.Find("attn_layer_indices", /*null_is_absent=*/true)) {
    f.Expect(idx->is_array(), f.Name("attn_layer_indices") + " must be an array of layer indices");
    for (const json& i : *idx) {
      int64_t at = 0;
      f.Expect(io_internal::ReadIntInRange(i, 0, c.num_hidden_layers - 1, &at),
               f.Name("attn_layer_indices") + " entry " + Describe(i) + " is not a layer index below " +
                   std::to_string(c.num_hidden_layers));
      attention[static_cast<size_t>(at)] = true;
    }
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!attention[static_cast<size_t>(i)]) c.linear_layers.push_back(static_cast<int>(i));
  }
  f.Expect(!c.linear_layers.empty(), f.Name("attn_layer_indices") + " leaves no mamba layer");
  return c;
}

// A finite number field (null refused: the config class's None would fail in the mixer).
double FiniteNumber(const ConfigFields& f, const char* key, const json& v) {
  f.Expect(v.is_number() && std::isfinite(v.get<double>()),
           f.Name(key) + " must be a finite number, got " + Describe(v));
  return v.get<double>();
}

// falcon_h1: every layer a mixer (beside its attention); I = mamba_d_ssm; in_proj's input scaled by
// ssm_in_multiplier and its output parts z, x, B, C, dt by ssm_multipliers (null: ones); the gated norm
// only with mamba_rms_norm (false: y * silu(z)), before the gate with mamba_norm_before_gate (true).
ModelConfig ReadFalconH1(const ConfigFields& f) {
  ModelConfig c = ReadSized(f, kFalconH1);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.linear_layers.push_back(static_cast<int>(i));
  if (const json* chunk = f.Find("mamba_chunk_size", /*null_is_absent=*/true)) {
    f.PositiveInt(*chunk, "mamba_chunk_size", kIntMax);  // the scan's chunking: no effect on the results
  }
  const json* in = f.Find("ssm_in_multiplier");
  const double in_mult = in != nullptr ? FiniteNumber(f, "ssm_in_multiplier", *in) : 1.0;
  std::array<double, 5> parts = {1.0, 1.0, 1.0, 1.0, 1.0};
  if (const json* m = f.Find("ssm_multipliers", /*null_is_absent=*/true)) {
    f.Expect(m->is_array() && m->size() == parts.size(),
             f.Name("ssm_multipliers") + " must be [z, x, B, C, dt] (5 numbers), got " + Describe(*m));
    for (size_t i = 0; i < parts.size(); ++i) parts[i] = FiniteNumber(f, "ssm_multipliers", (*m)[i]);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    // transformers keeps the multipliers in a float32 vector
    c.ssd_multipliers[i] = in_mult * static_cast<double>(static_cast<float>(parts[i]));
    f.Expect(std::abs(c.ssd_multipliers[i]) <= std::numeric_limits<float>::max(),
             f.Name("ssm_in_multiplier") + " * " + f.Name("ssm_multipliers") + " is beyond float's range");
  }
  c.ssd_rms_norm = f.BoolOr("mamba_rms_norm", false);
  c.ssd_norm_before_gate = f.BoolOr("mamba_norm_before_gate", true);
  return c;
}

// zamba2: every layer holds a mixer: layer_types (the config's alias of layers_block_type, winning over it)
// or layers_block_type, "mamba" / "linear_attention" a mixer layer, "hybrid" the shared attention block
// then a mixer; absent, transformers' 54-layer default.
ModelConfig ReadZamba2(const ConfigFields& f) {
  ModelConfig c = ReadSized(f, kZamba2);
  const char* key = Field(f, "layer_types", "layers_block_type");
  if (const json* list = f.Find(key, /*null_is_absent=*/true)) {
    MixerLayers(f, key, *list, {"hybrid"}, &c, /*others_are_mixers=*/true);
    c.num_hidden_layers = static_cast<int64_t>(list->size());
  } else {
    c.num_hidden_layers = 54;
    c.linear_layers.clear();
    for (int i = 0; i < 54; ++i) c.linear_layers.push_back(i);
  }
  return c;
}

DeltaRuleGeometry MixerGeometry(const ModelConfig& c) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Mamba2(c.hidden_size, c.num_v_heads, c.head_v_dim, c.head_k_dim,
                                                  c.num_k_heads, c.conv_size, c.rms_norm_eps);
  g.dt_min = static_cast<float>(c.dt_min);  // the reader keeps it within float's range
  // A max beyond float's range bounds nothing (the float conversion of such a double is undefined).
  g.dt_max = c.dt_max <= std::numeric_limits<float>::max() ? static_cast<float>(c.dt_max)
                                                           : std::numeric_limits<float>::infinity();
  g.ssd_norm = !c.ssd_rms_norm          ? SsdNorm::kGateOnly
               : c.ssd_norm_before_gate ? SsdNorm::kNormThenGate
                                        : SsdNorm::kGateThenNorm;
  for (size_t i = 0; i < g.ssd_multipliers.size(); ++i) g.ssd_multipliers[i] = static_cast<float>(c.ssd_multipliers[i]);
  return g;
}

// The Mamba2 layout at a geometry (the full layer's or a tp rank's: whole groups, or a part of one group's heads
// with its B and C whole): per group g (a key head) I/G rows of z and x, N of B and C, r of dt.
TensorTable MixerTensors(const DeltaRuleGeometry& g) {
  const int64_t rv = int64_t{g.group()} * g.V;  // z and x rows (conv channels) per group
  const int64_t n = g.K;                        // B and C rows per group
  const int64_t r = g.group();                  // heads per group
  const int64_t inner = g.value_dim();
  const Parts conv = {{rv, R::kV}, {n, R::kK}, {n, R::kQ}};
  TensorTable t = {
      Projection("in_proj.weight", 2 * inner + 2 * g.key_dim() + g.HV, g.hidden,
                 {{rv, R::kOutGate}, {rv, R::kV}, {n, R::kK}, {n, R::kQ}, {r, R::kGate}}, 0.02F),
      Conv("conv1d.weight", g.conv_channels(), g.W, conv),
      ConvBias("conv1d.bias", g.conv_channels(), conv),
      DtBias(g.HV, r),
      ALog({{g.HV}}, r),
      HeadParam("D", g.HV, r, R::kD, 0.5F, 1.5F),
      HeadParam("norm.weight", inner, rv, R::kNorm, 0.5F, 1.5F),
      OutProj("out_proj.weight", g.hidden, inner, rv),
  };
  if (g.ssd_norm == SsdNorm::kGateOnly) {  // Falcon-H1 without mamba_rms_norm: no norm weight
    std::erase_if(t, [](const TensorSpec& s) { return s.parts.front().role == R::kNorm; });
  }
  return t;
}

std::string MixerDescription(const std::string& what) {
  return "One Mamba2 mixer of a " + what +
         " checkpoint (in_proj rows z|x|B|C|dt, conv1d over x|B|C with its bias, D, the gated norm over groups): "
         "the SSD recurrence without the delta rule, a decay per head, states [H, P, N] as transformers' cache.";
}

}  // namespace

// Codestral Mamba 7B (Mamba2Config's defaults): hidden 4096, 128 heads of 64, N 128, 8 groups.
LayerFamily Mamba2() {
  return Family("Mamba2Mixer", {{"mamba2"}}, "mixer.", DeltaRuleGeometry::Mamba2(4096, 128, 64, 128, 8, 4, 1e-5),
                ReadMamba2, MixerGeometry, MixerTensors,
                MixerDescription("Mamba2 (model_type mamba2, backbone.layers.{i}.mixer.)"));
}

// Nemotron-H 8B: hidden 4096, 128 heads of 64, N 128, 8 groups.
LayerFamily NemotronH() {
  return Family("NemotronHMamba2Mixer", {{"nemotron_h"}}, "mixer.",
                DeltaRuleGeometry::Mamba2(4096, 128, 64, 128, 8, 4, 1e-5), ReadNemotronH, MixerGeometry, MixerTensors,
                MixerDescription("Nemotron-H (model_type nemotron_h, backbone.layers.{i}.mixer.)"));
}

// Granite-4.0-H-Small: hidden 4096, 128 heads of 64, N 128, one group.
LayerFamily GraniteMoeHybrid() {
  return Family("GraniteMoeHybridMambaLayer", {{"granitemoehybrid"}}, "mamba.",
                DeltaRuleGeometry::Mamba2(4096, 128, 64, 128, 1, 4, 1e-5), ReadGranite, MixerGeometry, MixerTensors,
                MixerDescription("Granite-4.0-H (model_type granitemoehybrid, model.layers.{i}.mamba.)"));
}

// Falcon-H1-7B: hidden 3072, 24 heads of 128, N 256, one group; the multipliers ones (they are per checkpoint);
// the norm on, before the gate (mamba_norm_before_gate's default): the gate alone, chained over random layers
// without the model's own pre-norms and residuals, grows without bound.
LayerFamily FalconH1() {
  DeltaRuleGeometry reference = DeltaRuleGeometry::Mamba2(3072, 24, 128, 256, 1, 4, 1e-5);
  reference.ssd_norm = SsdNorm::kNormThenGate;
  return Family("FalconH1Mixer", {{"falcon_h1"}}, "mamba.", reference, ReadFalconH1, MixerGeometry, MixerTensors,
                MixerDescription("Falcon-H1 (model_type falcon_h1, model.layers.{i}.mamba., beside each layer's "
                                 "attention)") +
                    " Variants: ssm_in_multiplier and ssm_multipliers on in_proj's parts z, x, B, C, dt; the norm "
                    "before the gate (mamba_norm_before_gate) or none (mamba_rms_norm false: no norm.weight).");
}

// Zamba2-2.7B: hidden 2560, 80 heads of 64, N 64, one group; dt clamped to (time_step_min, inf).
LayerFamily Zamba2() {
  DeltaRuleGeometry reference = DeltaRuleGeometry::Mamba2(2560, 80, 64, 64, 1, 4, 1e-5);
  reference.dt_min = 1e-3F;
  LayerFamily f = Family("Zamba2MambaMixer", {{"zamba2"}}, "mamba.", reference, ReadZamba2, MixerGeometry, MixerTensors,
                         MixerDescription("Zamba2 (model_type zamba2, model.layers.{i}.mamba., a hybrid layer's "
                                          "model.layers.{i}.mamba_decoder.mamba.)") +
                             " dt is clamped to (time_step_min, inf).");
  f.other_layer_prefixes = {"mamba_decoder.mamba."};
  return f;
}

// Bamba-9B: hidden 4096, 128 heads of 64, N 128, one group.
LayerFamily Bamba() {
  return Family("BambaMixer", {{"bamba"}}, "mamba.", DeltaRuleGeometry::Mamba2(4096, 128, 64, 128, 1, 4, 1e-5),
                ReadBamba, MixerGeometry, MixerTensors,
                MixerDescription("Bamba (model_type bamba, model.layers.{i}.mamba.)"));
}

}  // namespace kda::families
