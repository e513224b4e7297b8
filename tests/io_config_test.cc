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

// A config's head shape {H, HV, K, V}: num_k_heads, num_v_heads, head_k_dim, head_v_dim.
std::vector<int> HeadShape(const ModelConfig& c) { return {c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim}; }

std::string ParseError(const json& config) {
  try {
    ParseModelConfig(config.dump(), "test-config");
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
    const ModelConfig config = LoadModelConfig(dir);
    EXPECT_EQ(config.hidden_size, 512);
    EXPECT_EQ(config.num_hidden_layers, 4);
    EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);
    EXPECT_EQ(config.model_type, "kimi_linear");
    EXPECT_EQ(HeadShape(config), (std::vector<int>{4, 4, 128, 128}));
    EXPECT_EQ(config.conv_size, 4);
    EXPECT_EQ(config.linear_layers, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(config.FirstLinearLayer(), 0);
    EXPECT_TRUE(config.IsLinearLayer(2));
    EXPECT_FALSE(config.IsLinearLayer(3));  // layer 4 (1-based) is full attention
  }
}

TEST(IoConfigTest, KdaLayersAreOneBasedInTheFile) {
  const ModelConfig config = ParseModelConfig(BaseConfig().dump(), "test-config");
  EXPECT_EQ(config.linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));  // sorted, 0-based
  EXPECT_TRUE(config.IsLinearLayer(0));
  EXPECT_FALSE(config.IsLinearLayer(3));
  EXPECT_TRUE(config.IsLinearLayer(6));
  EXPECT_FALSE(config.IsLinearLayer(7));
  EXPECT_FALSE(config.IsLinearLayer(-1));
  EXPECT_EQ(config.FirstLinearLayer(), 0);

  json later = BaseConfig();
  later["linear_attn_config"]["kda_layers"] = {8, 3};
  const ModelConfig late = ParseModelConfig(later.dump(), "test-config");
  EXPECT_EQ(late.linear_layers, (std::vector<int>{2, 7}));
  EXPECT_EQ(late.FirstLinearLayer(), 2);
}

TEST(IoConfigTest, ReadsFieldsAndIgnoresLegacyHeadDim) {
  const ModelConfig config = ParseModelConfig(BaseConfig().dump(), "test-config");
  EXPECT_EQ(config.hidden_size, 2304);
  EXPECT_EQ(config.num_hidden_layers, 8);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_EQ(config.model_type, "kimi_linear");
  EXPECT_EQ(HeadShape(config), (std::vector<int>{32, 32, 128, 128}));  // K and V: not the top-level 72
  EXPECT_EQ(config.conv_size, 4);
}

TEST(IoConfigTest, RmsNormEpsDefaultsAndMustBePositive) {
  json config = BaseConfig();
  config.erase("rms_norm_eps");
  EXPECT_DOUBLE_EQ(ParseModelConfig(config.dump(), "test-config").rms_norm_eps, 1e-5);
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
  EXPECT_THROW(ParseModelConfig("{\"hidden_size\": ", "test-config"), Error);
  try {
    ParseModelConfig(R"({"hidden_size": 1, "hidden_size": 2})", "test-config");
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
    LoadModelConfig(dir.string());
    ADD_FAILURE() << "loaded a config from an empty directory";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "config.json not found in " + dir.string());
  }

  std::ofstream(dir / "config.json") << BaseConfig().dump();
  EXPECT_EQ(LoadModelConfig(dir.string()).num_k_heads, 32);
  std::ofstream(dir / "config.json") << "{}";
  try {
    LoadModelConfig(dir.string());
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
    const std::string message = ErrorOf([&] { ParseModelConfig(deep, "test-config"); });
    EXPECT_EQ(message.rfind("test-config: config nests arrays or objects deeper than 64 levels (at byte ", 0), 0U)
        << message;
    // Within the limit: refused for its type, the value shown in brief.
    const std::string shallow = ConfigTextWith(put, Nested(60, "1"));
    const std::string brief = ErrorOf([&] { ParseModelConfig(shallow, "test-config"); });
    EXPECT_NE(brief.find("[[[...]]]"), std::string::npos) << brief;
    EXPECT_LT(brief.size(), 200U) << brief;
  }
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

using testing::ErrorOf;

// A valid flat Gated DeltaNet config (Qwen3-Next's field names), 8 layers, every 4th full attention.
json QwenNextConfig() {
  return json::parse(R"({
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_hidden_layers": 8,
    "rms_norm_eps": 1e-6,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention"]
  })");
}

// A Qwen3.5 (vision-language) config: the text model under text_config.
json Qwen35Config() {
  json text = QwenNextConfig();
  text["model_type"] = "qwen3_5_text";
  text["linear_num_value_heads"] = 48;
  json config = {{"model_type", "qwen3_5"}, {"text_config", text}, {"vision_config", {{"hidden_size", 1152}}}};
  return config;
}

ModelConfig Parse(const json& config) { return ParseModelConfig(config.dump(), "test-config"); }

TEST(IoConfigTest, SupportedModelTypes) {
  EXPECT_EQ(SupportedModelTypes(), (std::vector<std::string>{"kimi_linear", "qwen3_next", "qwen3_5", "qwen3_5_text",
                                                             "qwen3_5_moe", "qwen3_5_moe_text"}));
}

TEST(IoConfigTest, GatedDeltaNetGoldenConfigsParse) {
  struct Case {
    const char* model;
    const char* model_type;
    int h, hv, k, v;
  };
  for (const Case& c : {Case{"gdn-mini", "qwen3_next", 4, 8, 32, 32}, Case{"gdn-gva3", "qwen3_5_text", 2, 6, 64, 48}}) {
    SCOPED_TRACE(c.model);
    const std::string dir = ::kda::testing::GoldenDir() + "/" + c.model;
    KDA_REQUIRE_GOLDEN_PATH(dir + "/config.json");
    const ModelConfig config = LoadModelConfig(dir);
    EXPECT_EQ(config.model_type, c.model_type);
    EXPECT_EQ(config.hidden_size, 256);
    EXPECT_EQ(config.num_hidden_layers, 4);
    EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
    EXPECT_EQ(HeadShape(config), (std::vector<int>{c.h, c.hv, c.k, c.v}));
    EXPECT_EQ(config.conv_size, 4);
    EXPECT_EQ(config.linear_layers, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(config.FirstLinearLayer(), 0);
    EXPECT_FALSE(config.IsLinearLayer(3));
  }
}

TEST(IoConfigTest, ReadsGatedDeltaNetFields) {
  const ModelConfig config = Parse(QwenNextConfig());
  EXPECT_EQ(config.model_type, "qwen3_next");
  EXPECT_EQ(config.hidden_size, 2048);
  EXPECT_EQ(config.num_hidden_layers, 8);
  EXPECT_EQ(HeadShape(config), (std::vector<int>{16, 32, 128, 64}));
  EXPECT_EQ(config.conv_size, 4);
  EXPECT_EQ(config.linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));

  // layer_types, not the interval, decides.
  json listed = QwenNextConfig();
  listed["layer_types"][0] = "full_attention";
  listed["layer_types"][7] = "linear_attention";
  EXPECT_EQ(Parse(listed).linear_layers, (std::vector<int>{1, 2, 4, 5, 6, 7}));
  EXPECT_EQ(Parse(listed).FirstLinearLayer(), 1);

  // Defaults: linear_conv_kernel_dim 4, rms_norm_eps 1e-6.
  json defaults = QwenNextConfig();
  defaults.erase("linear_conv_kernel_dim");
  defaults.erase("rms_norm_eps");
  EXPECT_EQ(Parse(defaults).conv_size, 4);
  EXPECT_DOUBLE_EQ(Parse(defaults).rms_norm_eps, 1e-6);
  defaults["linear_conv_kernel_dim"] = 3;
  EXPECT_EQ(Parse(defaults).conv_size, 3);

  for (const char* type : {"qwen3_5_text", "qwen3_5_moe_text"}) {
    json flat = QwenNextConfig();
    flat["model_type"] = type;
    EXPECT_EQ(Parse(flat).model_type, type);
  }
}

TEST(IoConfigTest, FullAttentionIntervalWithoutLayerTypes) {
  json config = QwenNextConfig();
  config.erase("layer_types");
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));
  config["full_attention_interval"] = 3;
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 3, 4, 6, 7}));
  config["full_attention_interval"] = 100;  // beyond the last layer: all linear
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  config.erase("full_attention_interval");  // default 4
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));
  config["layer_types"] = nullptr;  // null is absent, as in transformers
  config["full_attention_interval"] = 2;
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 2, 4, 6}));

  config["full_attention_interval"] = 0;
  ExpectRefused(config, "full_attention_interval must be a positive integer");
  config["full_attention_interval"] = "4";
  ExpectRefused(config, "full_attention_interval must be a positive integer");
}

TEST(IoConfigTest, NestedTextConfig) {
  const ModelConfig config = Parse(Qwen35Config());
  EXPECT_EQ(config.model_type, "qwen3_5_text");
  EXPECT_EQ(config.hidden_size, 2048);
  EXPECT_EQ(HeadShape(config), (std::vector<int>{16, 48, 128, 64}));
  EXPECT_EQ(config.linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));

  // Without text_config.model_type the top-level type + "_text" is reported.
  json moe = Qwen35Config();
  moe["model_type"] = "qwen3_5_moe";
  moe["text_config"].erase("model_type");
  EXPECT_EQ(Parse(moe).model_type, "qwen3_5_moe_text");
  moe["text_config"]["model_type"] = "qwen3_5_moe_text";
  EXPECT_EQ(Parse(moe).model_type, "qwen3_5_moe_text");

  // The text model's fields are read from text_config only, and named so.
  json nested = Qwen35Config();
  nested["linear_num_key_heads"] = 16;
  nested["text_config"].erase("linear_num_key_heads");
  ExpectRefused(nested, "missing text_config.linear_num_key_heads");
  nested = Qwen35Config();
  nested["text_config"]["linear_value_head_dim"] = 0;
  ExpectRefused(nested, "text_config.linear_value_head_dim must be a positive integer");
  nested = Qwen35Config();
  nested["text_config"]["layer_types"][2] = "sliding_attention";
  ExpectRefused(nested, "text_config.layer_types entry 2 is \"sliding_attention\"");
  nested = Qwen35Config();
  nested["text_config"]["model_type"] = "llama";
  ExpectRefused(nested,
                "text_config.model_type must be one of qwen3_next, qwen3_5_text, qwen3_5_moe_text, got \"llama\"");

  nested = Qwen35Config();
  nested.erase("text_config");
  ExpectRefused(nested, "missing text_config");
  nested["text_config"] = json::array();
  ExpectRefused(nested, "text_config is not a JSON object");

  const std::string duplicate = ErrorOf([] {
    ParseModelConfig(R"({"model_type": "qwen3_5", "text_config": {"hidden_size": 1, "hidden_size": 2}})",
                     "test-config");
  });
  EXPECT_NE(duplicate.find("duplicate key 'hidden_size'"), std::string::npos) << duplicate;
}

TEST(IoConfigTest, RefusesValueHeadsNotAMultipleOfKeyHeads) {
  json config = QwenNextConfig();
  config["linear_num_value_heads"] = 24;
  ExpectRefused(config, "linear_num_value_heads (24) must be a multiple of linear_num_key_heads (16)");
  config["linear_num_value_heads"] = 8;  // fewer value heads than key heads
  ExpectRefused(config, "linear_num_value_heads (8) must be a multiple of linear_num_key_heads (16)");
  json nested = Qwen35Config();
  nested["text_config"]["linear_num_value_heads"] = 20;
  ExpectRefused(nested,
                "text_config.linear_num_value_heads (20) must be a multiple of text_config.linear_num_key_heads (16)");
}

TEST(IoConfigTest, RefusesBadLayerTypes) {
  json config = QwenNextConfig();
  config["layer_types"][5] = "mamba";
  ExpectRefused(config, "layer_types entry 5 is \"mamba\", not \"linear_attention\" or \"full_attention\"");
  config["layer_types"][5] = 1;
  ExpectRefused(config, "layer_types entry 5 is 1, not \"linear_attention\" or \"full_attention\"");

  config = QwenNextConfig();
  config["layer_types"].erase(7);
  ExpectRefused(config, "layer_types has 7 entries, but num_hidden_layers is 8");
  config["layer_types"].push_back("linear_attention");
  config["layer_types"].push_back("linear_attention");
  ExpectRefused(config, "layer_types has 9 entries, but num_hidden_layers is 8");
  config["layer_types"] = "linear_attention";
  ExpectRefused(config, "layer_types is not an array");
}

TEST(IoConfigTest, RefusesConfigsWithoutALinearLayer) {
  json config = QwenNextConfig();
  for (json& entry : config["layer_types"]) entry = "full_attention";
  ExpectRefused(config, "layer_types has no \"linear_attention\" entry");

  config.erase("layer_types");
  config["full_attention_interval"] = 1;
  ExpectRefused(config, "no linear_attention layer");
  config["num_hidden_layers"] = 1;
  config.erase("full_attention_interval");
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0}));
}

TEST(IoConfigTest, RefusesBadGatedDeltaNetSizes) {
  for (const char* field : {"hidden_size", "num_hidden_layers", "linear_num_key_heads", "linear_num_value_heads",
                            "linear_key_head_dim", "linear_value_head_dim"}) {
    SCOPED_TRACE(field);
    json config = QwenNextConfig();
    config.erase(field);
    const std::string missing = ParseError(config);
    EXPECT_EQ(missing, std::string("test-config: missing ") + field);
    config[field] = 0;
    ExpectRefused(config, std::string(field) + " must be a positive integer");
    config[field] = 4.5;
    ExpectRefused(config, std::string(field) + " must be a positive integer");
  }
  json config = QwenNextConfig();
  config["linear_conv_kernel_dim"] = -1;
  ExpectRefused(config, "linear_conv_kernel_dim must be a positive integer");
  config = QwenNextConfig();
  config["rms_norm_eps"] = 0.0;
  ExpectRefused(config, "rms_norm_eps must be > 0");
  // The layer list may be implied, so the layer count is bounded.
  config = QwenNextConfig();
  config.erase("layer_types");
  config["num_hidden_layers"] = int64_t{1} << 30;
  ExpectRefused(config, "num_hidden_layers must be a positive integer (at most 65536)");
}

TEST(IoConfigTest, RefusesUnsupportedModelTypes) {
  json config = QwenNextConfig();
  config["model_type"] = "llama";
  EXPECT_EQ(ParseError(config),
            "test-config: unsupported model_type \"llama\" (supported: kimi_linear, qwen3_next, qwen3_5, qwen3_5_text, "
            "qwen3_5_moe, qwen3_5_moe_text)");
  config["model_type"] = 3;
  ExpectRefused(config, "model_type must be a string, got 3");

  // Without model_type the config is read as Kimi-Linear, and a missing linear_attn_config says so.
  config.erase("model_type");
  ExpectRefused(config, "missing linear_attn_config (a config without model_type is read as kimi_linear");
  json kimi = BaseConfig();
  kimi.erase("model_type");
  EXPECT_EQ(Parse(kimi).model_type, "kimi_linear");
  EXPECT_EQ(Parse(kimi).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));
}

}  // namespace
}  // namespace kda
