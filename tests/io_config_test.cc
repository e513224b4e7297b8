#include "kda/io/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kda/base/error.h"
#include "tests/error_util.h"
#include "tests/golden.h"

namespace kda {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A valid config in the shape of the real model's (1-based kda_layers, legacy top-level head_dim).
json BaseConfig() {
  return json::parse(R"({
    "model_type": "kimi_linear",
    "hidden_size": 2304,
    "num_hidden_layers": 8,
    "head_dim": 72,
    "rms_norm_eps": 1e-6,
    "linear_attn_config": {
      "kda_layers": [7, 1, 2, 3, 5, 6],
      "full_attn_layers": [4, 8],
      "head_dim": 128,
      "num_heads": 32,
      "short_conv_kernel_size": 4
    }
  })");
}

std::string ParseError(const json& config) {
  try {
    ParseKimiLinearConfig(config.dump(), "test-config");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Expects `config` to be refused with a message from the origin containing `expected`.
void ExpectRefused(const json& config, const std::string& expected) {
  const std::string message = ParseError(config);
  EXPECT_EQ(message.rfind("test-config: ", 0), 0U) << message;
  EXPECT_NE(message.find(expected), std::string::npos) << "message: " << message << "\nexpected: " << expected;
}

TEST(IoConfigTest, GoldenConfigsParse) {
  for (const char* model : {"kda-mini", "kda-stress"}) {
    const std::string dir = ::kda::testing::GoldenDir() + "/" + model;
    KDA_REQUIRE_GOLDEN_PATH(dir + "/config.json");
    const KimiLinearConfig config = LoadKimiLinearConfig(dir);
    EXPECT_EQ(config.hidden_size, 512);
    EXPECT_EQ(config.num_hidden_layers, 4);
    EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);
    EXPECT_EQ(config.num_heads, 4);
    EXPECT_EQ(config.head_dim, 128);
    EXPECT_EQ(config.conv_size, 4);
    EXPECT_EQ(config.kda_layers, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(config.projection_size(), 512);
    EXPECT_EQ(config.FirstKdaLayer(), 0);
    EXPECT_TRUE(config.IsKdaLayer(2));
    EXPECT_FALSE(config.IsKdaLayer(3));  // layer 4 (1-based) is full attention
  }
}

TEST(IoConfigTest, KdaLayersAreOneBasedInTheFile) {
  const KimiLinearConfig config = ParseKimiLinearConfig(BaseConfig().dump(), "test-config");
  EXPECT_EQ(config.kda_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));  // sorted, 0-based
  EXPECT_TRUE(config.IsKdaLayer(0));
  EXPECT_FALSE(config.IsKdaLayer(3));
  EXPECT_TRUE(config.IsKdaLayer(6));
  EXPECT_FALSE(config.IsKdaLayer(7));
  EXPECT_FALSE(config.IsKdaLayer(-1));
  EXPECT_EQ(config.FirstKdaLayer(), 0);

  json later = BaseConfig();
  later["linear_attn_config"]["kda_layers"] = {8, 3};
  const KimiLinearConfig late = ParseKimiLinearConfig(later.dump(), "test-config");
  EXPECT_EQ(late.kda_layers, (std::vector<int>{2, 7}));
  EXPECT_EQ(late.FirstKdaLayer(), 2);
}

TEST(IoConfigTest, ReadsFieldsAndIgnoresLegacyHeadDim) {
  const KimiLinearConfig config = ParseKimiLinearConfig(BaseConfig().dump(), "test-config");
  EXPECT_EQ(config.hidden_size, 2304);
  EXPECT_EQ(config.num_hidden_layers, 8);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_EQ(config.num_heads, 32);
  EXPECT_EQ(config.head_dim, 128);  // not the top-level 72
  EXPECT_EQ(config.conv_size, 4);
  EXPECT_EQ(config.projection_size(), 4096);
}

TEST(IoConfigTest, RmsNormEpsDefaultsAndMustBePositive) {
  json config = BaseConfig();
  config.erase("rms_norm_eps");
  EXPECT_DOUBLE_EQ(ParseKimiLinearConfig(config.dump(), "test-config").rms_norm_eps, 1e-5);
  config["rms_norm_eps"] = 0.0;
  ExpectRefused(config, "rms_norm_eps must be > 0");
  config["rms_norm_eps"] = "1e-5";
  ExpectRefused(config, "rms_norm_eps must be a number");
}

TEST(IoConfigTest, RefusesMissingLinearAttnConfig) {
  json config = BaseConfig();
  config.erase("linear_attn_config");
  ExpectRefused(config, "missing linear_attn_config");
  config["linear_attn_config"] = json::array();
  ExpectRefused(config, "linear_attn_config is not a JSON object");
}

TEST(IoConfigTest, RefusesBadKdaLayers) {
  json config = BaseConfig();
  config["linear_attn_config"]["kda_layers"] = {0, 1};
  ExpectRefused(config, "kda_layers entry 0 is outside [1, num_hidden_layers = 8]");
  config["linear_attn_config"]["kda_layers"] = {1, 9};
  ExpectRefused(config, "kda_layers entry 9 is outside [1, num_hidden_layers = 8]");
  config["linear_attn_config"]["kda_layers"] = json::array({-1});
  ExpectRefused(config, "kda_layers entry -1 is outside");
  config["linear_attn_config"]["kda_layers"] = {2, 3, 2};
  ExpectRefused(config, "kda_layers entry 2 is listed twice");
  config["linear_attn_config"]["kda_layers"] = {1, "2"};
  ExpectRefused(config, "kda_layers entry \"2\" is not an integer");
  config["linear_attn_config"]["kda_layers"] = json::array({1.5});
  ExpectRefused(config, "kda_layers entry 1.5 is not an integer");
  config["linear_attn_config"]["kda_layers"] = json::array();
  ExpectRefused(config, "linear_attn_config.kda_layers is empty");
  config["linear_attn_config"]["kda_layers"] = 3;
  ExpectRefused(config, "linear_attn_config.kda_layers is not an array");
  config["linear_attn_config"].erase("kda_layers");
  ExpectRefused(config, "missing linear_attn_config.kda_layers");
}

TEST(IoConfigTest, RefusesBadSizes) {
  for (const char* field : {"hidden_size", "num_hidden_layers"}) {
    json config = BaseConfig();
    config.erase(field);
    ExpectRefused(config, std::string("missing ") + field);
    config[field] = 0;
    ExpectRefused(config, std::string(field) + " must be a positive integer");
    config[field] = -4;
    ExpectRefused(config, std::string(field) + " must be a positive integer");
    config[field] = 512.5;
    ExpectRefused(config, std::string(field) + " must be a positive integer");
  }
  for (const char* field : {"num_heads", "head_dim", "short_conv_kernel_size"}) {
    const std::string name = std::string("linear_attn_config.") + field;
    json config = BaseConfig();
    config["linear_attn_config"].erase(field);
    ExpectRefused(config, "missing " + name);
    config["linear_attn_config"][field] = 0;
    ExpectRefused(config, name + " must be a positive integer");
    config["linear_attn_config"][field] = "4";
    ExpectRefused(config, name + " must be a positive integer");
    config["linear_attn_config"][field] = int64_t{1} << 40;  // does not fit int
    ExpectRefused(config, name + " must be a positive integer (at most 2147483647)");
  }
}

TEST(IoConfigTest, RefusesMalformedJson) {
  EXPECT_THROW(ParseKimiLinearConfig("{\"hidden_size\": ", "test-config"), Error);
  try {
    ParseKimiLinearConfig(R"({"hidden_size": 1, "hidden_size": 2})", "test-config");
    ADD_FAILURE() << "duplicate key accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key 'hidden_size'"), std::string::npos) << e.what();
  }
  ExpectRefused(json::array(), "config is not a JSON object");
}

TEST(IoConfigTest, MissingConfigFile) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("kda_io_config_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  try {
    LoadKimiLinearConfig(dir.string());
    ADD_FAILURE() << "loaded a config from an empty directory";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "config.json not found in " + dir.string());
  }

  std::ofstream(dir / "config.json") << BaseConfig().dump();
  EXPECT_EQ(LoadKimiLinearConfig(dir.string()).num_heads, 32);
  std::ofstream(dir / "config.json") << "{}";
  try {
    LoadKimiLinearConfig(dir.string());
    ADD_FAILURE() << "loaded an empty config";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "config.json").string() + ": missing hidden_size");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

// BaseConfig() as text with `value` (JSON text) in place of the field set by `put`.
std::string ConfigTextWith(const std::function<void(json&)>& put, const std::string& value) {
  json config = BaseConfig();
  put(config);  // puts the marker string
  std::string text = config.dump();
  const std::string marker = "\"@value@\"";
  text.replace(text.find(marker), marker.size(), value);
  return text;
}

using testing::ErrorOf;

std::string Nested(int depth, const std::string& inner) {
  return std::string(static_cast<size_t>(depth), '[') + inner + std::string(static_cast<size_t>(depth), ']');
}

// Found by fuzzing: hidden_size, rms_norm_eps or a kda_layers entry nested ~66k deep crashed `kda run` with a
// stack overflow while the error message formatted the value. Nesting is refused before parsing, and values are
// shown briefly.
TEST(IoConfigTest, RefusesDeeplyNestedValues) {
  const std::vector<std::pair<std::string, std::function<void(json&)>>> fields = {
      {"hidden_size", [](json& c) { c["hidden_size"] = "@value@"; }},
      {"rms_norm_eps", [](json& c) { c["rms_norm_eps"] = "@value@"; }},
      {"kda_layers entry", [](json& c) { c["linear_attn_config"]["kda_layers"][2] = "@value@"; }},
  };
  for (const auto& [name, put] : fields) {
    SCOPED_TRACE(name);
    const std::string deep = ConfigTextWith(put, Nested(66000, "1"));
    const std::string message = ErrorOf([&] { ParseKimiLinearConfig(deep, "test-config"); });
    EXPECT_EQ(message.rfind("test-config: config nests arrays or objects deeper than 64 levels (at byte ", 0), 0U)
        << message;
    // Within the limit: refused for its type, the value shown in brief.
    const std::string shallow = ConfigTextWith(put, Nested(60, "1"));
    const std::string brief = ErrorOf([&] { ParseKimiLinearConfig(shallow, "test-config"); });
    EXPECT_NE(brief.find("[[[...]]]"), std::string::npos) << brief;
    EXPECT_LT(brief.size(), 200U) << brief;
  }
}

}  // namespace
}  // namespace kda
