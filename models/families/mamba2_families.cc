// The Mamba2 mixer families (the SSD layer, DeltaRuleGeometry::ssd): Mamba2 (Codestral Mamba), Nemotron-H,
// Granite-4.0-H (granitemoehybrid) and Bamba, each an entry of the registry (kda/models/layer_family.h): its
// config reader (the field names and defaults of its transformers 5.25 config class), geometry, tensor table
// and reference layer. One checkpoint layout serves all four: in_proj [2I + 2GN + H, hidden] (rows
// z | x | B | C | dt), conv1d [I + 2GN, 1, W] with its bias (channels x | B | C), dt_bias, A_log and D [H], the
// gated norm [I], out_proj [hidden, I]; I = H P, G groups of B and C of state size N.
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
};

// `legacy` where the config has it (not null), else `key`.
const char* Field(const ConfigFields& f, const char* legacy, const char* key) {
  return legacy != nullptr && f.Find(legacy, /*null_is_absent=*/true) != nullptr ? legacy : key;
}

// The mixer layers of a layer list whose entries name each layer: "mamba" or "linear_attention" (a mixer),
// or one of `others`.
void MixerLayers(const ConfigFields& f, const char* key, const json& list, const std::vector<std::string>& others,
                 ModelConfig* config) {
  f.Expect(list.is_array() && !list.empty() && static_cast<int64_t>(list.size()) <= kMaxImpliedLayers,
           f.Name(key) + " must be a non-empty array of layer types");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const bool mixer = e.is_string() && (e == "mamba" || e == "linear_attention");
    bool other = false;
    for (const std::string& o : others) other = other || (e.is_string() && e == o);
    f.Expect(mixer || other, f.Name(key) + " entry " + std::to_string(i) + " is " + Describe(e) +
                                 ", not \"mamba\", \"linear_attention\" or another layer type of the model");
    if (mixer) config->linear_layers.push_back(static_cast<int>(i));
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
  const json* head_dim = f.Find(s.head_dim, /*null_is_absent=*/true);
  if (s.head_dim_default == 0 && (head_dim == nullptr || (head_dim->is_string() && *head_dim == "auto"))) {
    const int64_t inner = expand * config.hidden_size;
    f.Expect(inner % config.num_v_heads == 0, f.Name(s.head_dim) + " is \"auto\", but " + f.Name(s.expand) +
                                                  " * hidden_size = " + std::to_string(inner) +
                                                  " is not a multiple of " + f.Name(s.heads));
    config.head_v_dim = static_cast<int>(inner / config.num_v_heads);
  } else {
    config.head_v_dim = static_cast<int>(int_field(s.head_dim, s.head_dim_default));
  }
  if (s.expand != nullptr) {
    f.Expect(expand * config.hidden_size == int64_t{config.num_v_heads} * config.head_v_dim,
             f.Name(s.expand) + " * hidden_size (" + std::to_string(expand * config.hidden_size) + ") must equal " +
                 f.Name(s.heads) + " * " + f.Name(s.head_dim) + " (" +
                 std::to_string(int64_t{config.num_v_heads} * config.head_v_dim) + ")");
  }
  f.Expect(config.num_v_heads % config.num_k_heads == 0,
           f.Name(s.heads) + " (" + std::to_string(config.num_v_heads) + ") must be a multiple of " +
               f.Name(Field(f, s.legacy_groups, s.groups)) + " (" + std::to_string(config.num_k_heads) + ")");
  config.rms_norm_eps = s.eps_default;
  if (const json* eps = f.Find(s.eps, /*null_is_absent=*/true)) {
    f.Expect(eps->is_number() && std::isfinite(eps->get<double>()) && eps->get<double>() > 0,
             f.Name(s.eps) + " must be a finite number > 0, got " + Describe(*eps));
    config.rms_norm_eps = eps->get<double>();
  }
  const char* conv_bias = Field(f, s.legacy_conv_bias, s.conv_bias);
  f.Expect(f.BoolOr(conv_bias, true), f.Name(conv_bias) + " false (a conv without bias) is not supported");
  f.Expect(!f.BoolOr(s.proj_bias, false), f.Name(s.proj_bias) + " true (biased in_proj and out_proj) is not supported");
  const std::string act = f.StringOr(s.act, "silu", /*nullable=*/true).value_or("silu");
  f.Expect(act == "silu" || act == "swish",
           f.Name(s.act) + " must be \"silu\" (the conv's activation), got " + Describe(json(act)));
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

DeltaRuleGeometry MixerGeometry(const ModelConfig& c) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Mamba2(c.hidden_size, c.num_v_heads, c.head_v_dim, c.head_k_dim,
                                                  c.num_k_heads, c.conv_size, c.rms_norm_eps);
  g.dt_min = static_cast<float>(c.dt_min);  // the reader keeps it within float's range
  // A max beyond float's range bounds nothing (the float conversion of such a double is undefined).
  g.dt_max = c.dt_max <= std::numeric_limits<float>::max() ? static_cast<float>(c.dt_max)
                                                           : std::numeric_limits<float>::infinity();
  return g;
}

// The Mamba2 layout at a geometry (the full layer's or a tp rank's, which keeps whole groups): per group g
// (a key head) I/G rows of z and x, N of B and C, r of dt.
TensorTable MixerTensors(const DeltaRuleGeometry& g) {
  const int64_t rv = int64_t{g.group()} * g.V;  // z and x rows (conv channels) per group
  const int64_t n = g.K;                        // B and C rows per group
  const int64_t r = g.group();                  // heads per group
  const int64_t inner = g.value_dim();
  const Parts conv = {{rv, R::kV}, {n, R::kK}, {n, R::kQ}};
  return {
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

// Bamba-9B: hidden 4096, 128 heads of 64, N 128, one group.
LayerFamily Bamba() {
  return Family("BambaMixer", {{"bamba"}}, "mamba.", DeltaRuleGeometry::Mamba2(4096, 128, 64, 128, 1, 4, 1e-5),
                ReadBamba, MixerGeometry, MixerTensors,
                MixerDescription("Bamba (model_type bamba, model.layers.{i}.mamba.)"));
}

}  // namespace kda::families
