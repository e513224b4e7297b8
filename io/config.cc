#include "kda/io/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
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

// Reads object[key] as an integer in [1, max]; `field` is the name used in messages.
int64_t RequirePositiveInt(const json& object, const char* key, const std::string& field, const std::string& origin,
                           int64_t max) {
  const auto it = object.find(key);
  Check(it != object.end(), origin + ": missing " + field);
  return ReadPositiveInt(*it, field, origin, max);
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
// Gated DeltaNet configs may imply their layer list (full_attention_interval), so the layer count is bounded
// here rather than by the file's size.
constexpr int64_t kMaxGatedDeltaNetLayers = int64_t{1} << 16;
constexpr int64_t kDefaultFullAttentionInterval = 4;
constexpr int64_t kDefaultGatedDeltaNetConvSize = 4;

constexpr const char* kKimiLinear = "kimi_linear";
// Gated DeltaNet model types whose fields are at the top level, and those that keep them under text_config.
const std::vector<std::string>& FlatGatedDeltaNetTypes() {
  static const std::vector<std::string> types = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};
  return types;
}
const std::vector<std::string>& NestedGatedDeltaNetTypes() {
  static const std::vector<std::string> types = {"qwen3_5", "qwen3_5_moe"};
  return types;
}

bool Contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

std::string Join(const std::vector<std::string>& list) {
  std::string out;
  for (const std::string& item : list) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Kimi-Linear: the delta-rule fields under linear_attn_config, kda_layers 1-based. `typed`: whether the config
// named its model_type (an untyped one is read as Kimi-Linear, so a missing linear_attn_config says so).
ModelConfig ParseKimiLinear(const json& root, const std::string& origin, bool typed) {
  ModelConfig config;
  config.model_type = kKimiLinear;
  config.hidden_size = RequirePositiveInt(root, "hidden_size", "hidden_size", origin, kInt64Max);
  config.num_hidden_layers = RequirePositiveInt(root, "num_hidden_layers", "num_hidden_layers", origin, kIntMax);
  config.rms_norm_eps = ReadRmsNormEps(root, "rms_norm_eps", origin, 1e-5);

  const auto linear = root.find("linear_attn_config");
  Check(linear != root.end(),
        origin + ": missing linear_attn_config" +
            (typed ? std::string()
                   : " (a config without model_type is read as kimi_linear; supported model types: " +
                         Join(SupportedModelTypes()) + ")"));
  Check(linear->is_object(), origin + ": linear_attn_config is not a JSON object");
  const int heads =
      static_cast<int>(RequirePositiveInt(*linear, "num_heads", "linear_attn_config.num_heads", origin, kIntMax));
  const int head_dim =
      static_cast<int>(RequirePositiveInt(*linear, "head_dim", "linear_attn_config.head_dim", origin, kIntMax));
  config.num_k_heads = config.num_v_heads = heads;
  config.head_k_dim = config.head_v_dim = head_dim;
  config.conv_size = static_cast<int>(RequirePositiveInt(*linear, "short_conv_kernel_size",
                                                         "linear_attn_config.short_conv_kernel_size", origin, kIntMax));

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

// Gated DeltaNet (Qwen3-Next, Qwen3.5): the fields of `text` (the root, or its text_config); `prefix` ("" or
// "text_config.") starts every field name in messages.
ModelConfig ParseGatedDeltaNet(const json& text, const std::string& model_type, const std::string& prefix,
                               const std::string& origin) {
  const auto field = [&](const char* key) { return prefix + key; };
  const auto require = [&](const char* key, int64_t max) {
    return RequirePositiveInt(text, key, field(key), origin, max);
  };

  ModelConfig config;
  config.model_type = model_type;
  config.hidden_size = require("hidden_size", kInt64Max);
  config.num_hidden_layers = require("num_hidden_layers", kMaxGatedDeltaNetLayers);
  config.rms_norm_eps = ReadRmsNormEps(text, field("rms_norm_eps"), origin, 1e-6);
  config.num_k_heads = static_cast<int>(require("linear_num_key_heads", kIntMax));
  config.num_v_heads = static_cast<int>(require("linear_num_value_heads", kIntMax));
  Check(config.num_v_heads % config.num_k_heads == 0, origin + ": " + field("linear_num_value_heads") + " (" +
                                                          std::to_string(config.num_v_heads) +
                                                          ") must be a multiple of " + field("linear_num_key_heads") +
                                                          " (" + std::to_string(config.num_k_heads) + ")");
  config.head_k_dim = static_cast<int>(require("linear_key_head_dim", kIntMax));
  config.head_v_dim = static_cast<int>(require("linear_value_head_dim", kIntMax));
  const auto conv = text.find("linear_conv_kernel_dim");
  config.conv_size =
      static_cast<int>(conv == text.end() ? kDefaultGatedDeltaNetConvSize
                                          : ReadPositiveInt(*conv, field("linear_conv_kernel_dim"), origin, kIntMax));

  // layer_types, as transformers reads it: null is absent (the layers then follow full_attention_interval).
  const auto types = text.find("layer_types");
  if (types != text.end() && !types->is_null()) {
    const std::string name = field("layer_types");
    Check(types->is_array(), origin + ": " + name + " is not an array");
    Check(types->size() == static_cast<size_t>(config.num_hidden_layers),
          origin + ": " + name + " has " + std::to_string(types->size()) + " entries, but " +
              field("num_hidden_layers") + " is " + std::to_string(config.num_hidden_layers));
    for (size_t i = 0; i < types->size(); ++i) {
      const json& entry = (*types)[i];
      const bool linear = entry.is_string() && entry.get_ref<const std::string&>() == "linear_attention";
      const bool full = entry.is_string() && entry.get_ref<const std::string&>() == "full_attention";
      Check(linear || full, origin + ": " + name + " entry " + std::to_string(i) + " is " +
                                io_internal::Describe(entry) + ", not \"linear_attention\" or \"full_attention\"");
      if (linear) config.linear_layers.push_back(static_cast<int>(i));
    }
    Check(!config.linear_layers.empty(), origin + ": " + name + " has no \"linear_attention\" entry");
  } else {
    const auto interval_it = text.find("full_attention_interval");
    const int64_t interval = interval_it == text.end()
                                 ? kDefaultFullAttentionInterval
                                 : ReadPositiveInt(*interval_it, field("full_attention_interval"), origin, kInt64Max);
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
      if ((i + 1) % interval != 0) config.linear_layers.push_back(static_cast<int>(i));
    }
    Check(!config.linear_layers.empty(), origin + ": no linear_attention layer: without " + field("layer_types") +
                                             ", " + field("full_attention_interval") + " = " +
                                             std::to_string(interval) + " makes every layer full attention (" +
                                             field("num_hidden_layers") + " = " +
                                             std::to_string(config.num_hidden_layers) + ")");
  }
  return config;
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
  static const std::vector<std::string> types = {kKimiLinear,    "qwen3_next",  "qwen3_5",
                                                 "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"};
  return types;
}

ModelConfig ParseModelConfig(const std::string& json_text, const std::string& origin) {
  const json root = io_internal::ParseJsonNoDuplicates(json_text, origin, "config");
  Check(root.is_object(), origin + ": config is not a JSON object");

  const auto type_it = root.find("model_type");
  if (type_it == root.end()) return ParseKimiLinear(root, origin, /*typed=*/false);
  Check(type_it->is_string(), origin + ": model_type must be a string, got " + io_internal::Describe(*type_it));
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type == kKimiLinear) return ParseKimiLinear(root, origin, /*typed=*/true);
  if (Contains(FlatGatedDeltaNetTypes(), type)) return ParseGatedDeltaNet(root, type, "", origin);
  Check(Contains(NestedGatedDeltaNetTypes(), type), origin + ": unsupported model_type " +
                                                        io_internal::Describe(*type_it) +
                                                        " (supported: " + Join(SupportedModelTypes()) + ")");

  const auto text = root.find("text_config");
  Check(text != root.end(), origin + ": missing text_config (model_type " + type + " keeps the text model there)");
  Check(text->is_object(), origin + ": text_config is not a JSON object");
  std::string text_type = type + "_text";
  if (const auto it = text->find("model_type"); it != text->end()) {
    Check(it->is_string() && Contains(FlatGatedDeltaNetTypes(), it->get_ref<const std::string&>()),
          origin + ": text_config.model_type must be one of " + Join(FlatGatedDeltaNetTypes()) + ", got " +
              io_internal::Describe(*it));
    text_type = it->get<std::string>();
  }
  return ParseGatedDeltaNet(*text, text_type, "text_config.", origin);
}

ModelConfig LoadModelConfig(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "config.json";
  std::error_code ec;
  Check(std::filesystem::is_regular_file(path, ec), "config.json not found in " + model_dir);
  return ParseModelConfig(io_internal::ReadFile(path.string()), path.string());
}

}  // namespace kda
