// Reading the fields of a Hugging Face config.json (io/config_fields.cc): the tools each layer family's
// config reader is written with (models/families/), so that every field is checked, defaulted and named
// in messages the same way. Internal to the component.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kda/io/config.h"

namespace kda::io_internal {

inline constexpr int64_t kIntMax = std::numeric_limits<int>::max();
inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
// A model type may imply its layer list (full_attention_interval and the like), so the layer count is
// bounded here rather than by the file's size.
inline constexpr int64_t kMaxImpliedLayers = int64_t{1} << 16;

// Reads a JSON integer in [lo, hi] (hi >= 0) into *out; false for anything else.
bool ReadIntInRange(const nlohmann::json& value, int64_t lo, int64_t hi, int64_t* out);

bool Contains(const std::vector<std::string>& list, const std::string& value);
std::string Join(const std::vector<std::string>& list);                // "a, b, c"
std::string QuotedAlternatives(const std::vector<std::string>& list);  // "\"a\", \"b\" or \"c\""

// The fields of one JSON object (the root, its text_config, or an object under them), named in messages
// with `prefix` ("", "text_config.", "text_config.linear_attn_config.") after the origin.
class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& object, std::string prefix, std::string origin);

  const nlohmann::json& object() const { return *object_; }
  const std::string& origin() const { return origin_; }
  std::string Name(const std::string& key) const { return prefix_ + key; }
  // Throws kda::Error("ORIGIN: message") unless `ok`.
  void Expect(bool ok, const std::string& message) const;

  // object[key]; nullptr when absent, or null and `null_is_absent` (transformers' `X | None = default` fields).
  const nlohmann::json* Find(const char* key, bool null_is_absent = false) const;
  // `value` (the field `key`) as an integer in [1, max].
  int64_t PositiveInt(const nlohmann::json& value, const char* key, int64_t max) const;
  int64_t RequireInt(const char* key, int64_t max) const;
  int64_t IntOr(const char* key, int64_t fallback, int64_t max = kIntMax) const;
  // The first of `keys` present (transformers' written field before the original one), else `fallback`.
  int64_t FirstIntOr(const std::vector<const char*>& keys, int64_t fallback, int64_t max = kIntMax) const;
  bool BoolOr(const char* key, bool fallback) const;
  // A string field; `fallback` when absent, std::nullopt when null and `nullable`.
  std::optional<std::string> StringOr(const char* key, const std::string& fallback, bool nullable) const;
  // rms_norm_eps, when present, a finite number > 0; otherwise `fallback`.
  double RmsNormEps(double fallback) const;
  // A KDA gate's lower bound L: a finite number < 0; `fallback` when absent; null, when `nullable`, is no bound.
  std::optional<double> LowerBound(const char* key, std::optional<double> fallback, bool nullable) const;
  // The object under `key`; std::nullopt when absent or null.
  std::optional<ConfigFields> Object(const char* key) const;

 private:
  const nlohmann::json* object_;
  std::string prefix_;
  std::string origin_;
};

// hidden_size and num_hidden_layers (required; the layers at most `max_layers`) and rms_norm_eps (default
// `rms_norm_eps`).
ModelConfig ReadSizes(const ConfigFields& f, double rms_norm_eps, int64_t max_layers = kMaxImpliedLayers);

// Which layers hold the delta rule: layer_types when given (null is absent, as in transformers;
// "linear_attention" entries), else the list transformers implies for the model type.
struct LayerRule {
  std::vector<std::string> other_types;  // the other layer_types entries the model type's layers accept
  const char* period_key = nullptr;      // the field setting the implied list's period (nullptr: fixed)
  int64_t period = 0;                    // its default
  bool (*linear)(int64_t layer, int64_t layers, int64_t period) = nullptr;  // the implied list
  const char* implied = nullptr;       // the fixed implied list in words (for the no-delta-rule-layer message)
  bool needs_attention_layer = false;  // layer_types must also hold another type (olmo_hybrid)
};

// Every layer but each period-th (1-based) is linear.
bool EveryPeriodthFull(int64_t layer, int64_t layers, int64_t period);

// Fills config->linear_layers by `rule`: each problem a kda::Error naming the field.
void ReadLayers(const ConfigFields& f, const LayerRule& rule, ModelConfig* config);

}  // namespace kda::io_internal
