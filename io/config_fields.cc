#include "io/config_fields.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "io/util.h"
#include "kda/base/error.h"

namespace kda::io_internal {

using nlohmann::json;

namespace {

constexpr const char* kLinearAttention = "linear_attention";

// Reads `value` as an integer in [1, max]; `field` is the name used in messages.
int64_t ReadPositiveInt(const json& value, const std::string& field, const std::string& origin, int64_t max) {
  int64_t out = 0;
  Check(ReadIntInRange(value, 1, max, &out), origin + ": " + field + " must be a positive integer (at most " +
                                                 std::to_string(max) + "), got " + Describe(value));
  return out;
}

}  // namespace

// nlohmann stores non-negative integers as uint64, which may not fit int64.
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

bool Contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

std::string Join(const std::vector<std::string>& list) {
  std::string out;
  for (const std::string& item : list) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string QuotedAlternatives(const std::vector<std::string>& list) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == list.size() ? " or " : ", ") + ("\"" + list[i] + "\"");
  }
  return out;
}

ConfigFields::ConfigFields(const json& object, std::string prefix, std::string origin)
    : object_(&object), prefix_(std::move(prefix)), origin_(std::move(origin)) {}

void ConfigFields::Expect(bool ok, const std::string& message) const { Check(ok, origin_ + ": " + message); }

const json* ConfigFields::Find(const char* key, bool null_is_absent) const {
  const auto it = object_->find(key);
  if (it == object_->end() || (null_is_absent && it->is_null())) return nullptr;
  return &*it;
}

int64_t ConfigFields::PositiveInt(const json& value, const char* key, int64_t max) const {
  return ReadPositiveInt(value, Name(key), origin_, max);
}

int64_t ConfigFields::RequireInt(const char* key, int64_t max) const {
  const json* value = Find(key);
  Expect(value != nullptr, "missing " + Name(key));
  return PositiveInt(*value, key, max);
}

int64_t ConfigFields::IntOr(const char* key, int64_t fallback, int64_t max) const {
  const json* value = Find(key);
  return value == nullptr ? fallback : PositiveInt(*value, key, max);
}

int64_t ConfigFields::FirstIntOr(const std::vector<const char*>& keys, int64_t fallback, int64_t max) const {
  for (const char* key : keys) {
    if (const json* value = Find(key)) return PositiveInt(*value, key, max);
  }
  return fallback;
}

bool ConfigFields::BoolOr(const char* key, bool fallback) const {
  const json* value = Find(key);
  if (value == nullptr) return fallback;
  Expect(value->is_boolean(), Name(key) + " must be true or false, got " + Describe(*value));
  return value->get<bool>();
}

std::optional<std::string> ConfigFields::StringOr(const char* key, const std::string& fallback, bool nullable) const {
  const json* value = Find(key);
  if (value == nullptr) return fallback;
  if (nullable && value->is_null()) return std::nullopt;
  Expect(value->is_string(),
         Name(key) + " must be a string" + (nullable ? " or null" : "") + ", got " + Describe(*value));
  return value->get<std::string>();
}

double ConfigFields::RmsNormEps(double fallback) const {
  const json* eps = Find("rms_norm_eps");
  if (eps == nullptr) return fallback;
  const std::string field = Name("rms_norm_eps");
  Expect(eps->is_number(), field + " must be a number, got " + Describe(*eps));
  const double value = eps->get<double>();
  Expect(std::isfinite(value) && value > 0, field + " must be > 0, got " + Describe(*eps));
  return value;
}

std::optional<double> ConfigFields::LowerBound(const char* key, std::optional<double> fallback, bool nullable) const {
  const json* value = Find(key);
  if (value == nullptr) return fallback;
  if (nullable && value->is_null()) return std::nullopt;
  Expect(value->is_number(),
         Name(key) + " must be a number" + (nullable ? " or null (no bound)" : "") + ", got " + Describe(*value));
  const double bound = value->get<double>();
  Expect(std::isfinite(bound) && bound < 0,
         Name(key) + " must be finite and < 0 (a lower bound of the log-space gate), got " + Describe(*value));
  return bound;
}

std::optional<ConfigFields> ConfigFields::Object(const char* key) const {
  const json* value = Find(key, /*null_is_absent=*/true);
  if (value == nullptr) return std::nullopt;
  Expect(value->is_object(), Name(key) + " is not a JSON object");
  return ConfigFields(*value, Name(key) + ".", origin_);
}

ModelConfig ReadSizes(const ConfigFields& f, double rms_norm_eps, int64_t max_layers) {
  ModelConfig config;
  config.hidden_size = f.RequireInt("hidden_size", kInt64Max);
  config.num_hidden_layers = f.RequireInt("num_hidden_layers", max_layers);
  config.rms_norm_eps = f.RmsNormEps(rms_norm_eps);
  return config;
}

bool EveryPeriodthFull(int64_t layer, int64_t /*layers*/, int64_t period) { return (layer + 1) % period != 0; }

void ReadLayers(const ConfigFields& f, const LayerRule& rule, ModelConfig* config) {
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
      f.Expect(
          entry.is_string() && Contains(accepted, entry.get_ref<const std::string&>()),
          name + " entry " + std::to_string(i) + " is " + Describe(entry) + ", not " + QuotedAlternatives(accepted));
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

}  // namespace kda::io_internal

namespace kda {

bool ModelConfig::IsLinearLayer(int layer) const {
  return std::binary_search(linear_layers.begin(), linear_layers.end(), layer);
}

int ModelConfig::FirstLinearLayer() const {
  Check(!linear_layers.empty(), "the model config has no delta-rule (linear attention) layers");
  return linear_layers.front();
}

}  // namespace kda
