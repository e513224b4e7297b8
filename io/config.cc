#include "kda/io/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/util.h"
#include "kda/base/error.h"

namespace kda {
namespace {

using nlohmann::json;

// Reads a JSON integer in [lo, hi] (hi >= 0) into *out; false for anything else. nlohmann stores non-negative
// integers as uint64, which may not fit int64.
bool ReadIntInRange(const json& value, int64_t lo, int64_t hi, int64_t* out) {
  if (!value.is_number_integer()) return false;
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(value.get<uint64_t>());
  } else {
    *out = value.get<int64_t>();
  }
  return *out >= lo && *out <= hi;
}

// Reads `value` as an integer in [1, max]; `field` is the name used in messages.
int64_t ReadPositiveInt(const json& value, const std::string& field, const std::string& origin, int64_t max) {
  int64_t out = 0;
  Check(ReadIntInRange(value, 1, max, &out), origin + ": " + field + " must be a positive integer (at most " +
                                                 std::to_string(max) + "), got " + io_internal::Describe(value));
  return out;
}

// Reads object["rms_norm_eps"], when present, as a finite number > 0; otherwise `fallback`.
double ReadRmsNormEps(const json& object, const std::string& field, const std::string& origin, double fallback) {
  const auto eps = object.find("rms_norm_eps");
  if (eps == object.end()) return fallback;
  Check(eps->is_number(), origin + ": " + field + " must be a number, got " + io_internal::Describe(*eps));
  const double value = eps->get<double>();
  Check(std::isfinite(value) && value > 0, origin + ": " + field + " must be > 0, got " + io_internal::Describe(*eps));
  return value;
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
// Every type but kimi_linear may imply its layer list (full_attention_interval and the like), so the layer count
// is bounded here rather than by the file's size.
constexpr int64_t kMaxImpliedLayers = int64_t{1} << 16;
constexpr const char* kLinearAttention = "linear_attention";

bool Contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

std::string Join(const std::vector<std::string>& list) {
  std::string out;
  for (const std::string& item : list) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// The fields of one JSON object (the root, its text_config, or an object under them), named in messages with
// `prefix` ("", "text_config.", "text_config.linear_attn_config.") after the origin.
class Fields {
 public:
  Fields(const json& object, std::string prefix, std::string origin)
      : object_(object), prefix_(std::move(prefix)), origin_(std::move(origin)) {}

  const json& object() const { return object_; }
  const std::string& origin() const { return origin_; }
  std::string Name(const std::string& key) const { return prefix_ + key; }
  // Throws kda::Error("ORIGIN: message") unless `ok`.
  void Expect(bool ok, const std::string& message) const { Check(ok, origin_ + ": " + message); }

  // object[key]; nullptr when absent, or null and `null_is_absent` (transformers' `X | None = default` fields).
  const json* Find(const char* key, bool null_is_absent = false) const {
    const auto it = object_.find(key);
    if (it == object_.end() || (null_is_absent && it->is_null())) return nullptr;
    return &*it;
  }
  int64_t PositiveInt(const json& value, const char* key, int64_t max) const {
    return ReadPositiveInt(value, Name(key), origin_, max);
  }
  int64_t RequireInt(const char* key, int64_t max) const {
    const json* value = Find(key);
    Expect(value != nullptr, "missing " + Name(key));
    return PositiveInt(*value, key, max);
  }
  int64_t IntOr(const char* key, int64_t fallback, int64_t max = kIntMax) const {
    const json* value = Find(key);
    return value == nullptr ? fallback : PositiveInt(*value, key, max);
  }
  bool BoolOr(const char* key, bool fallback) const {
    const json* value = Find(key);
    if (value == nullptr) return fallback;
    Expect(value->is_boolean(), Name(key) + " must be true or false, got " + io_internal::Describe(*value));
    return value->get<bool>();
  }
  // A string field; `fallback` when absent, std::nullopt when null and `nullable`.
  std::optional<std::string> StringOr(const char* key, const std::string& fallback, bool nullable) const {
    const json* value = Find(key);
    if (value == nullptr) return fallback;
    if (nullable && value->is_null()) return std::nullopt;
    Expect(value->is_string(),
           Name(key) + " must be a string" + (nullable ? " or null" : "") + ", got " + io_internal::Describe(*value));
    return value->get<std::string>();
  }
  double RmsNormEps(double fallback) const { return ReadRmsNormEps(object_, Name("rms_norm_eps"), origin_, fallback); }
  // A KDA gate's lower bound L: a finite number < 0; `fallback` when absent; null, when `nullable`, is no bound.
  std::optional<double> LowerBound(const char* key, std::optional<double> fallback, bool nullable) const {
    const json* value = Find(key);
    if (value == nullptr) return fallback;
    if (nullable && value->is_null()) return std::nullopt;
    Expect(value->is_number(), Name(key) + " must be a number" + (nullable ? " or null (no bound)" : "") + ", got " +
                                   io_internal::Describe(*value));
    const double bound = value->get<double>();
    Expect(std::isfinite(bound) && bound < 0,
           Name(key) + " must be finite and < 0 (a lower bound of the log-space gate), got " +
               io_internal::Describe(*value));
    return bound;
  }
  // The object under `key`; std::nullopt when absent or null.
  std::optional<Fields> Object(const char* key) const {
    const json* value = Find(key, /*null_is_absent=*/true);
    if (value == nullptr) return std::nullopt;
    Expect(value->is_object(), Name(key) + " is not a JSON object");
    return Fields(*value, Name(key) + ".", origin_);
  }

 private:
  const json& object_;
  std::string prefix_;
  std::string origin_;
};

// hidden_size and num_hidden_layers (required) and rms_norm_eps.
ModelConfig ReadSizes(const Fields& f, double rms_norm_eps, int64_t max_layers = kMaxImpliedLayers) {
  ModelConfig config;
  config.hidden_size = f.RequireInt("hidden_size", kInt64Max);
  config.num_hidden_layers = f.RequireInt("num_hidden_layers", max_layers);
  config.rms_norm_eps = f.RmsNormEps(rms_norm_eps);
  return config;
}

// "a", "b" or "c", for messages.
std::string QuotedAlternatives(const std::vector<std::string>& list) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == list.size() ? " or " : ", ") + ("\"" + list[i] + "\"");
  }
  return out;
}

// Which layers hold the delta rule: layer_types when given (null is absent, as in transformers; "linear_attention"
// entries), else the list transformers implies for the model type.
struct LayerRule {
  std::vector<std::string> other_types;  // the other layer_types entries the model type's layers accept
  const char* period_key;                // the field setting the implied list's period (nullptr: fixed)
  int64_t period;                        // its default
  bool (*linear)(int64_t layer, int64_t layers, int64_t period);  // the implied list
  const char* implied;         // the fixed implied list in words (for the no-delta-rule-layer message)
  bool needs_attention_layer;  // layer_types must also hold another type (olmo_hybrid)
};

bool EveryPeriodthFull(int64_t layer, int64_t /*layers*/, int64_t period) { return (layer + 1) % period != 0; }

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
const LayerRule& Glm5NextLayers() {  // full_attention is read as indexed_attention
  static const LayerRule rule{{"full_attention", "indexed_attention"},
                              nullptr,
                              0,
                              [](int64_t layer, int64_t /*layers*/, int64_t /*period*/) { return layer % 4 != 3; },
                              "the implied list (every 4th layer indexed attention)",
                              false};
  return rule;
}
const LayerRule& BailingHybridLayers() {
  static const LayerRule rule{{"full_attention"}, "layer_group_size", 6, EveryPeriodthFull, nullptr, false};
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

void ReadLayers(const Fields& f, const LayerRule& rule, ModelConfig* config) {
  const std::string layers = f.Name("num_hidden_layers");
  if (const json* types = f.Find("layer_types", /*null_is_absent=*/true)) {
    const std::string name = f.Name("layer_types");
    f.Expect(types->is_array(), name + " is not an array");
    f.Expect(types->size() == static_cast<size_t>(config->num_hidden_layers),
             name + " has " + std::to_string(types->size()) + " entries, but " + layers + " is " +
                 std::to_string(config->num_hidden_layers));
    std::vector<std::string> accepted = {kLinearAttention};
    accepted.insert(accepted.end(), rule.other_types.begin(), rule.other_types.end());
    for (size_t i = 0; i < types->size(); ++i) {
      const json& entry = (*types)[i];
      f.Expect(entry.is_string() && Contains(accepted, entry.get_ref<const std::string&>()),
               name + " entry " + std::to_string(i) + " is " + io_internal::Describe(entry) + ", not " +
                   QuotedAlternatives(accepted));
      if (entry.get_ref<const std::string&>() == kLinearAttention) config->linear_layers.push_back(static_cast<int>(i));
    }
    f.Expect(!config->linear_layers.empty(), name + " has no \"linear_attention\" entry");
    f.Expect(!rule.needs_attention_layer || config->linear_layers.size() < types->size(),
             name + " has only \"linear_attention\" entries (the model needs an attention layer too)");
    return;
  }
  const int64_t period = rule.period_key == nullptr ? 0 : f.IntOr(rule.period_key, rule.period, kInt64Max);
  for (int64_t i = 0; i < config->num_hidden_layers; ++i) {
    if (rule.linear(i, config->num_hidden_layers, period)) config->linear_layers.push_back(static_cast<int>(i));
  }
  const std::string implied =
      rule.period_key == nullptr ? std::string(rule.implied) : f.Name(rule.period_key) + " = " + std::to_string(period);
  f.Expect(!config->linear_layers.empty(), "no linear_attention layer: without " + f.Name("layer_types") + ", " +
                                               implied + " makes every layer full attention (" + layers + " = " +
                                               std::to_string(config->num_hidden_layers) + ")");
}

// Kimi-Linear: the delta-rule fields under linear_attn_config, kda_layers 1-based. `typed`: whether the config
// named its model_type (an untyped one is read as Kimi-Linear, so a missing linear_attn_config says so).
ModelConfig ReadKimiLinear(const Fields& f, bool typed) {
  const std::string& origin = f.origin();
  ModelConfig config = ReadSizes(f, 1e-5, kIntMax);  // kda_layers lists the layers: no bound but int's
  config.model_type = "kimi_linear";

  const auto linear = f.object().find("linear_attn_config");
  Check(linear != f.object().end(),
        origin + ": missing linear_attn_config" +
            (typed ? std::string()
                   : " (a config without model_type is read as kimi_linear; supported model types: " +
                         Join(SupportedModelTypes()) + ")"));
  Check(linear->is_object(), origin + ": linear_attn_config is not a JSON object");
  const Fields lac(*linear, "linear_attn_config.", origin);
  config.num_k_heads = config.num_v_heads = static_cast<int>(lac.RequireInt("num_heads", kIntMax));
  config.head_k_dim = config.head_v_dim = static_cast<int>(lac.RequireInt("head_dim", kIntMax));
  config.conv_size = static_cast<int>(lac.RequireInt("short_conv_kernel_size", kIntMax));

  const auto layers = linear->find("kda_layers");
  Check(layers != linear->end(), origin + ": missing linear_attn_config.kda_layers");
  Check(layers->is_array(), origin + ": linear_attn_config.kda_layers is not an array");
  Check(!layers->empty(), origin + ": linear_attn_config.kda_layers is empty");
  std::set<int64_t> seen;
  for (const json& entry : *layers) {
    const std::string problem = origin + ": linear_attn_config.kda_layers entry " + io_internal::Describe(entry);
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

// GLM-5-Next (Glm5NextTextConfig): KDA with H = linear_num_heads, K = V = linear_head_dim, conv
// linear_conv_kernel_dim and a lower-bound gate linear_lower_bound (null: the softplus gate); a
// linear_attn_config object, when given, overrides them (num_heads, head_dim, short_conv_kernel_size,
// gate_lower_bound), and its safe_gate (default true) turns a missing bound into -5.
ModelConfig ReadGlm5Next(const Fields& f) {
  ModelConfig config = ReadSizes(f, 1e-5);
  const std::optional<Fields> lac = f.Object("linear_attn_config");
  // The field of linear_attn_config that overrides a top-level one, when both are there.
  const auto source = [&](const char* key, const char* override_key) {
    return lac && lac->Find(override_key) != nullptr ? std::make_pair(*lac, override_key) : std::make_pair(f, key);
  };
  const auto read_int = [&](const char* key, const char* override_key, int64_t fallback) {
    const auto [fields, name] = source(key, override_key);
    return static_cast<int>(fields.IntOr(name, fallback));
  };
  config.num_k_heads = config.num_v_heads = read_int("linear_num_heads", "num_heads", 64);
  config.head_k_dim = config.head_v_dim = read_int("linear_head_dim", "head_dim", 128);
  config.conv_size = read_int("linear_conv_kernel_dim", "short_conv_kernel_size", 4);
  const auto [fields, name] = source("linear_lower_bound", "gate_lower_bound");
  config.gate_lower_bound = fields.LowerBound(name, -5.0, /*nullable=*/true);
  const bool safe_gate = lac && lac->BoolOr("safe_gate", true);
  if (safe_gate && !config.gate_lower_bound) config.gate_lower_bound = -5.0;
  ReadLayers(f, Glm5NextLayers(), &config);
  return config;
}

// Bailing-hybrid (BailingHybridConfig): KDA with H = num_attention_heads, K = V = head_dim, conv
// short_conv_kernel_size, and the lower-bound gate kda_lower_bound when kda_safe_gate.
ModelConfig ReadBailingHybrid(const Fields& f) {
  ModelConfig config = ReadSizes(f, 1e-6);
  config.num_k_heads = config.num_v_heads = static_cast<int>(f.IntOr("num_attention_heads", 32));
  config.head_k_dim = config.head_v_dim = static_cast<int>(f.IntOr("head_dim", 128));
  config.conv_size = static_cast<int>(f.IntOr("short_conv_kernel_size", 4));
  if (f.BoolOr("kda_safe_gate", true)) config.gate_lower_bound = f.LowerBound("kda_lower_bound", -5.0, false);
  ReadLayers(f, BailingHybridLayers(), &config);
  return config;
}

// A Gated DeltaNet model type whose fields follow Qwen3-Next's names (linear_num_key_heads,
// linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim), with its defaults.
struct GdnSpec {
  std::array<int64_t, 4> heads;  // the four head fields' defaults in that order; 0: required
  bool derived_heads;            // olmo_hybrid: absent or null head fields derive from others (OlmoHeadDefault)
  double rms_norm_eps;
  const LayerRule& (*layers)();
  void (*extra)(const Fields&, ModelConfig*);  // the type's own fields, or nullptr
};

constexpr std::array<const char*, 4> kGdnHeadFields = {"linear_num_key_heads", "linear_num_value_heads",
                                                       "linear_key_head_dim", "linear_value_head_dim"};

// OlmoHybridConfig's defaults: the head counts num_attention_heads (default 30), the key dim
// int(0.75 * hidden_size / linear_num_key_heads), the value dim twice the key dim.
int64_t OlmoHeadDefault(const Fields& f, size_t field, const ModelConfig& config) {
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

ModelConfig ReadGatedDeltaNet(const Fields& f, const GdnSpec& spec) {
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
void ReadOlmoHybridFields(const Fields& f, ModelConfig* config) {
  config->allow_neg_eigval = f.BoolOr("linear_allow_neg_eigval", true);
}

// qwen4_exp: the output gate's activation, output_gate_type or (null, absent or "", as transformers' `or` reads
// it) hidden_act (default "silu").
void ReadQwen4ExpFields(const Fields& f, ModelConfig* config) {
  const std::vector<std::string> accepted = {"sigmoid", "silu"};
  const std::string gate = f.StringOr("output_gate_type", "", /*nullable=*/true).value_or("");
  const char* key = gate.empty() ? "hidden_act" : "output_gate_type";
  const std::string activation = gate.empty() ? *f.StringOr("hidden_act", "silu", /*nullable=*/false) : gate;
  f.Expect(Contains(accepted, activation),
           f.Name(key) + " must be " + QuotedAlternatives(accepted) +
               (gate.empty() ? " (the output gate's activation when output_gate_type is unset)" : "") + ", got " +
               io_internal::Describe(json(activation)));
  config->output_gate_activation = activation;
}

constexpr GdnSpec kQwenGdn{{0, 0, 0, 0}, false, 1e-6, QwenLayers, nullptr};
constexpr GdnSpec kQwen4Exp{{16, 32, 128, 128}, false, 1e-6, Qwen4ExpLayers, ReadQwen4ExpFields};
constexpr GdnSpec kLaraMini{{8, 16, 128, 128}, false, 1e-6, LaraMiniLayers, nullptr};
constexpr GdnSpec kOlmoHybrid{{0, 0, 0, 0}, true, 1e-6, OlmoHybridLayers, ReadOlmoHybridFields};

// Where a model type keeps its text model: at the top level, under text_config, or either (text_config absent or
// null: the top level).
enum class Nesting { kFlat, kNested, kNestedOrFlat };

// A supported model_type: where its text model's fields sit and how they are read (SupportedModelTypes' order).
struct ModelType {
  std::string name;
  Nesting nesting;
  std::vector<std::string> text_types;  // nested: the accepted text_config.model_type values
  std::function<ModelConfig(const Fields&)> read;
};

const std::vector<ModelType>& ModelTypes() {
  const auto gdn = [](const GdnSpec& spec) {
    return [spec = &spec](const Fields& f) { return ReadGatedDeltaNet(f, *spec); };
  };
  const auto kimi = [](const Fields& f) { return ReadKimiLinear(f, /*typed=*/true); };
  const std::vector<std::string> qwen3_5_text = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};
  static const std::vector<ModelType> types = {
      {"kimi_linear", Nesting::kFlat, {}, kimi},
      {"qwen3_next", Nesting::kFlat, {}, gdn(kQwenGdn)},
      {"qwen3_5", Nesting::kNested, qwen3_5_text, gdn(kQwenGdn)},
      {"qwen3_5_text", Nesting::kFlat, {}, gdn(kQwenGdn)},
      {"qwen3_5_moe", Nesting::kNested, qwen3_5_text, gdn(kQwenGdn)},
      {"qwen3_5_moe_text", Nesting::kFlat, {}, gdn(kQwenGdn)},
      {"glm5_next", Nesting::kNestedOrFlat, {"glm5_next_text"}, ReadGlm5Next},
      {"glm5_next_text", Nesting::kFlat, {}, ReadGlm5Next},
      {"bailing_hybrid", Nesting::kFlat, {}, ReadBailingHybrid},
      {"olmo_hybrid", Nesting::kFlat, {}, gdn(kOlmoHybrid)},
      {"lara_mini", Nesting::kFlat, {}, gdn(kLaraMini)},
      {"qwen4_exp", Nesting::kNested, {"qwen4_exp_text"}, gdn(kQwen4Exp)},
      {"qwen4_exp_text", Nesting::kFlat, {}, gdn(kQwen4Exp)},
  };
  return types;
}

}  // namespace

bool ModelConfig::IsLinearLayer(int layer) const {
  return std::binary_search(linear_layers.begin(), linear_layers.end(), layer);
}

int ModelConfig::FirstLinearLayer() const {
  Check(!linear_layers.empty(), "the model config has no delta-rule (linear attention) layers");
  return linear_layers.front();
}

const std::vector<std::string>& SupportedModelTypes() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> names;
    for (const ModelType& type : ModelTypes()) names.push_back(type.name);
    return names;
  }();
  return types;
}

ModelConfig ParseModelConfig(const std::string& json_text, const std::string& origin) {
  const json root = io_internal::ParseJsonNoDuplicates(json_text, origin, "config");
  Check(root.is_object(), origin + ": config is not a JSON object");
  const Fields top(root, "", origin);

  const auto type_it = root.find("model_type");
  if (type_it == root.end()) return ReadKimiLinear(top, /*typed=*/false);
  Check(type_it->is_string(), origin + ": model_type must be a string, got " + io_internal::Describe(*type_it));
  const std::string& name = type_it->get_ref<const std::string&>();
  const auto& types = ModelTypes();
  const auto type = std::find_if(types.begin(), types.end(), [&](const ModelType& t) { return t.name == name; });
  Check(type != types.end(), origin + ": unsupported model_type " + io_internal::Describe(*type_it) +
                                 " (supported: " + Join(SupportedModelTypes()) + ")");

  const auto text = root.find("text_config");
  const bool flat = type->nesting == Nesting::kFlat ||
                    (type->nesting == Nesting::kNestedOrFlat && (text == root.end() || text->is_null()));
  if (flat) {
    ModelConfig config = type->read(top);
    config.model_type = type->nesting == Nesting::kFlat ? name : name + "_text";
    return config;
  }
  Check(text != root.end(), origin + ": missing text_config (model_type " + name + " keeps the text model there)");
  Check(text->is_object(), origin + ": text_config is not a JSON object");
  std::string text_type = name + "_text";
  if (const auto it = text->find("model_type"); it != text->end()) {
    Check(it->is_string() && Contains(type->text_types, it->get_ref<const std::string&>()),
          origin + ": text_config.model_type must be " + (type->text_types.size() > 1 ? "one of " : "") +
              Join(type->text_types) + ", got " + io_internal::Describe(*it));
    text_type = it->get<std::string>();
  }
  ModelConfig config = type->read(Fields(*text, "text_config.", origin));
  config.model_type = text_type;
  return config;
}

ModelConfig LoadModelConfig(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "config.json";
  std::error_code ec;
  Check(std::filesystem::is_regular_file(path, ec), "config.json not found in " + model_dir);
  return ParseModelConfig(io_internal::ReadFile(path.string()), path.string());
}

}  // namespace kda
