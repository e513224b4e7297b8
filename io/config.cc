#include "kda/io/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

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

// Reads object[key] as an integer in [1, max]; `field` is the name used in messages.
int64_t RequirePositiveInt(const json& object, const char* key, const std::string& field, const std::string& origin,
                           int64_t max) {
  const auto it = object.find(key);
  Check(it != object.end(), origin + ": missing " + field);
  int64_t value = 0;
  Check(ReadIntInRange(*it, 1, max, &value), origin + ": " + field + " must be a positive integer (at most " +
                                                 std::to_string(max) + "), got " + io_internal::Describe(*it));
  return value;
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

}  // namespace

bool KimiLinearConfig::IsKdaLayer(int layer) const {
  return std::binary_search(kda_layers.begin(), kda_layers.end(), layer);
}

int KimiLinearConfig::FirstKdaLayer() const {
  Check(!kda_layers.empty(), "the model config has no KDA layers");
  return kda_layers.front();
}

KimiLinearConfig ParseKimiLinearConfig(const std::string& json_text, const std::string& origin) {
  const json root = io_internal::ParseJsonNoDuplicates(json_text, origin, "config");
  Check(root.is_object(), origin + ": config is not a JSON object");

  KimiLinearConfig config;
  config.hidden_size = RequirePositiveInt(root, "hidden_size", "hidden_size", origin, kInt64Max);
  config.num_hidden_layers = RequirePositiveInt(root, "num_hidden_layers", "num_hidden_layers", origin, kIntMax);

  if (const auto eps = root.find("rms_norm_eps"); eps != root.end()) {
    Check(eps->is_number(), origin + ": rms_norm_eps must be a number, got " + io_internal::Describe(*eps));
    config.rms_norm_eps = eps->get<double>();
    Check(std::isfinite(config.rms_norm_eps) && config.rms_norm_eps > 0,
          origin + ": rms_norm_eps must be > 0, got " + io_internal::Describe(*eps));
  }

  const auto linear = root.find("linear_attn_config");
  Check(linear != root.end(), origin + ": missing linear_attn_config");
  Check(linear->is_object(), origin + ": linear_attn_config is not a JSON object");
  config.num_heads =
      static_cast<int>(RequirePositiveInt(*linear, "num_heads", "linear_attn_config.num_heads", origin, kIntMax));
  config.head_dim =
      static_cast<int>(RequirePositiveInt(*linear, "head_dim", "linear_attn_config.head_dim", origin, kIntMax));
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
    config.kda_layers.push_back(static_cast<int>(layer - 1));
  }
  std::sort(config.kda_layers.begin(), config.kda_layers.end());
  return config;
}

KimiLinearConfig LoadKimiLinearConfig(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "config.json";
  std::error_code ec;
  Check(std::filesystem::is_regular_file(path, ec), "config.json not found in " + model_dir);
  return ParseKimiLinearConfig(io_internal::ReadFile(path.string()), path.string());
}

}  // namespace kda
