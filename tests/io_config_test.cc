#include "kda/io/config.h"
#include "kda/models/layer_family.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
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

// What every model type reads, in one line: "TYPE hidden N layers L eps E heads H/HV/K/V conv W linear 0,1,..".
std::string Summary(const ModelConfig& c) {
  std::ostringstream s;
  s << c.model_type << " hidden " << c.hidden_size << " layers " << c.num_hidden_layers << " eps " << c.rms_norm_eps
    << " heads " << c.num_k_heads << "/" << c.num_v_heads << "/" << c.head_k_dim << "/" << c.head_v_dim << " conv "
    << c.conv_size << " linear ";
  for (size_t i = 0; i < c.linear_layers.size(); ++i) s << (i == 0 ? "" : ",") << c.linear_layers[i];
  return s.str();
}

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
  config["linear_attn_config"].erase("kda_layers");  // the implied list
  EXPECT_EQ(ParseModelConfig(config.dump(), "test-config").linear_layers, (std::vector<int>{0, 1, 2, 3, 5, 6, 7}));
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
    config["linear_attn_config"].erase(field);  // KimiLinearConfig's default
    EXPECT_NO_THROW(ParseModelConfig(config.dump(), "test-config")) << field;
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
  EXPECT_EQ(SupportedModelTypes(),
            (std::vector<std::string>{"kimi_linear", "qwen3_next", "qwen3_5_text", "qwen3_5", "qwen3_5_moe_text",
                                      "qwen3_5_moe", "glm5_next_text", "glm5_next", "bailing_hybrid", "olmo_hybrid",
                                      "lara_mini", "qwen4_exp_text", "qwen4_exp", "granitemoehybrid", "nemotron_h",
                                      "bamba", "mamba2", "falcon_h1", "zamba2"}));
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
            "test-config: unsupported model_type \"llama\" (supported: kimi_linear, qwen3_next, qwen3_5_text, qwen3_5, "
            "qwen3_5_moe_text, qwen3_5_moe, glm5_next_text, glm5_next, bailing_hybrid, olmo_hybrid, lara_mini, "
            "qwen4_exp_text, qwen4_exp, granitemoehybrid, nemotron_h, bamba, mamba2, falcon_h1, zamba2)");
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

namespace kda {
namespace {

// Expects `config` to be refused with exactly "test-config: " + `message`.
void ExpectRefusedWith(const json& config, const std::string& message) {
  EXPECT_EQ(ParseError(config), "test-config: " + message);
}

// The variant settings of a config: {gate_lower_bound or "none", allow_neg_eigval, output_gate_activation}.
std::string Variant(const ModelConfig& c) {
  return (c.gate_lower_bound ? std::to_string(*c.gate_lower_bound) : std::string("none")) + " " +
         (c.allow_neg_eigval ? "neg" : "pos") + " \"" + c.output_gate_activation + "\"";
}

json Repeat(const std::vector<std::string>& pattern, int times) {
  json out = json::array();
  for (int i = 0; i < times; ++i) {
    for (const std::string& type : pattern) out.push_back(type);
  }
  return out;
}

// A multimodal checkpoint's config: the text model under text_config, 8 layers of which every 4th is of type
// `fourth`, a vision tower beside it.
json UnderTextConfig(const char* model_type, json text, const char* fourth, int vision_hidden) {
  text["layer_types"] = Repeat({"linear_attention", "linear_attention", "linear_attention", fourth}, 2);
  return {{"model_type", model_type},
          {"text_config", std::move(text)},
          {"vision_config", {{"hidden_size", vision_hidden}}}};
}

// GLM-5.3-Flash's shape (Glm5NextConfig): the text model under text_config, 64 KDA heads of 128, hidden 4096,
// every 4th layer indexed (DSA) attention.
json Glm5NextConfig() {
  return UnderTextConfig("glm5_next", json::parse(R"({
    "model_type": "glm5_next_text",
    "hidden_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 64,
    "rms_norm_eps": 1e-5,
    "linear_num_heads": 64,
    "linear_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0,
    "qk_nope_head_dim": 256,
    "kv_lora_rank": 512
  })"),
                         "indexed_attention", 1024);
}

TEST(IoConfigTest, ReadsGlm5NextFields) {
  const ModelConfig config = Parse(Glm5NextConfig());
  EXPECT_EQ(Summary(config),
            "glm5_next_text hidden 4096 layers 8 eps 1e-05 heads 64/64/128/128 conv 4 linear 0,1,2,4,5,6");
  ASSERT_TRUE(config.gate_lower_bound.has_value());
  EXPECT_EQ(*config.gate_lower_bound, -5.0);
  EXPECT_FALSE(config.allow_neg_eigval);
  EXPECT_EQ(config.output_gate_activation, "");

  // Flat: glm5_next_text, and glm5_next without (or with a null) text_config, whose fields are then at the top.
  json flat = Glm5NextConfig()["text_config"];
  EXPECT_EQ(Parse(flat).model_type, "glm5_next_text");
  EXPECT_EQ(Parse(flat).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));
  flat["model_type"] = "glm5_next";
  EXPECT_EQ(Parse(flat).model_type, "glm5_next_text");
  EXPECT_EQ(HeadShape(Parse(flat)), (std::vector<int>{64, 64, 128, 128}));
  flat["text_config"] = nullptr;
  EXPECT_EQ(Parse(flat).hidden_size, 4096);
  json nested = Glm5NextConfig();
  nested["text_config"].erase("model_type");
  EXPECT_EQ(Parse(nested).model_type, "glm5_next_text");

  // "full_attention" is an indexed-attention layer to transformers: not a delta-rule layer either.
  nested = Glm5NextConfig();
  nested["text_config"]["layer_types"][0] = "full_attention";
  EXPECT_EQ(Parse(nested).linear_layers, (std::vector<int>{1, 2, 4, 5, 6}));
}

TEST(IoConfigTest, Glm5NextDefaults) {
  json config = Glm5NextConfig();
  json& text = config["text_config"];
  for (const char* field : {"rms_norm_eps", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim",
                            "linear_lower_bound", "layer_types"}) {
    text.erase(field);
  }
  text["num_hidden_layers"] = 10;
  const ModelConfig defaults = Parse(config);
  EXPECT_DOUBLE_EQ(defaults.rms_norm_eps, 1e-5);
  EXPECT_EQ(HeadShape(defaults), (std::vector<int>{64, 64, 128, 128}));
  EXPECT_EQ(defaults.conv_size, 4);
  EXPECT_EQ(Variant(defaults), "-5.000000 pos \"\"");
  EXPECT_EQ(defaults.linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6, 8, 9}));  // layer i % 4 == 3: attention

  // The lower bound: null is none (the softplus gate), any negative number is the bound.
  text["linear_lower_bound"] = nullptr;
  EXPECT_FALSE(Parse(config).gate_lower_bound.has_value());
  text["linear_lower_bound"] = -3.5;
  EXPECT_EQ(Variant(Parse(config)), "-3.500000 pos \"\"");
  text["linear_lower_bound"] = -2;
  EXPECT_EQ(Variant(Parse(config)), "-2.000000 pos \"\"");
  text["layer_types"] = nullptr;  // null is absent
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6, 8, 9}));
}

TEST(IoConfigTest, Glm5NextLinearAttnConfigOverrides) {
  json config = Glm5NextConfig();
  json& text = config["text_config"];
  text["linear_attn_config"] = {
      {"num_heads", 32}, {"head_dim", 64}, {"short_conv_kernel_size", 3}, {"gate_lower_bound", -2.0}};
  const ModelConfig over = Parse(config);
  EXPECT_EQ(HeadShape(over), (std::vector<int>{32, 32, 64, 64}));
  EXPECT_EQ(over.conv_size, 3);
  EXPECT_EQ(Variant(over), "-2.000000 pos \"\"");
  // Kimi-Linear's kda_layers is not read: layer_types decides.
  text["linear_attn_config"]["kda_layers"] = {1};
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));

  // Fields it lacks keep the top-level values; its safe_gate (default true) turns no bound into -5.
  text["linear_lower_bound"] = nullptr;
  text["linear_attn_config"] = json::object();
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{64, 64, 128, 128}));
  EXPECT_EQ(Variant(Parse(config)), "-5.000000 pos \"\"");
  text["linear_attn_config"] = {{"gate_lower_bound", nullptr}};
  EXPECT_EQ(Variant(Parse(config)), "-5.000000 pos \"\"");
  text["linear_attn_config"]["safe_gate"] = false;
  EXPECT_EQ(Variant(Parse(config)), "none pos \"\"");
  text["linear_attn_config"] = {{"safe_gate", false}};
  EXPECT_EQ(Variant(Parse(config)), "none pos \"\"");
  text["linear_lower_bound"] = -3.0;  // safe_gate false keeps a given bound
  EXPECT_EQ(Variant(Parse(config)), "-3.000000 pos \"\"");
  text["linear_lower_bound"] = nullptr;
  text["linear_attn_config"] = nullptr;  // null is absent: no safe_gate rule
  EXPECT_EQ(Variant(Parse(config)), "none pos \"\"");
}

TEST(IoConfigTest, RefusesBadGlm5NextConfigs) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& message) {
    json config = Glm5NextConfig();
    edit(config["text_config"]);
    ExpectRefusedWith(config, message);
  };
  refused([](json& t) { t["linear_lower_bound"] = "-5"; },
          "text_config.linear_lower_bound must be a number or null (no bound), got \"-5\"");
  refused([](json& t) { t["linear_lower_bound"] = 0.0; },
          "text_config.linear_lower_bound must be finite and < 0 (a lower bound of the log-space gate), got 0.0");
  refused([](json& t) { t["linear_lower_bound"] = 5; },
          "text_config.linear_lower_bound must be finite and < 0 (a lower bound of the log-space gate), got 5");
  refused(
      [](json& t) {
        t["linear_attn_config"] = {{"gate_lower_bound", 0}};
      },
      "text_config.linear_attn_config.gate_lower_bound must be finite and < 0 (a lower bound of the log-space "
      "gate), got 0");
  refused(
      [](json& t) {
        t["linear_attn_config"] = {{"safe_gate", "yes"}};
      },
      "text_config.linear_attn_config.safe_gate must be true or false, got \"yes\"");
  refused([](json& t) { t["linear_attn_config"] = json::array(); },
          "text_config.linear_attn_config is not a JSON object");
  refused(
      [](json& t) {
        t["linear_attn_config"] = {{"head_dim", nullptr}};
      },
      "text_config.linear_attn_config.head_dim must be a positive integer (at most 2147483647), got null");
  refused([](json& t) { t["linear_num_heads"] = 0; },
          "text_config.linear_num_heads must be a positive integer (at most 2147483647), got 0");
  refused([](json& t) { t["linear_conv_kernel_dim"] = 4.5; },
          "text_config.linear_conv_kernel_dim must be a positive integer (at most 2147483647), got 4.5");
  refused([](json& t) { t["rms_norm_eps"] = -1e-5; }, "text_config.rms_norm_eps must be > 0, got -1e-05");
  refused([](json& t) { t.erase("hidden_size"); }, "missing text_config.hidden_size");
  refused([](json& t) { t["model_type"] = "qwen3_5_text"; },
          "text_config.model_type must be glm5_next_text, got \"qwen3_5_text\"");
  refused([](json& t) { t["layer_types"][3] = "sliding_attention"; },
          "text_config.layer_types entry 3 is \"sliding_attention\", not \"linear_attention\", \"full_attention\" or "
          "\"indexed_attention\"");
  refused([](json& t) { t["layer_types"][3] = 7; },
          "text_config.layer_types entry 3 is 7, not \"linear_attention\", \"full_attention\" or "
          "\"indexed_attention\"");
  refused([](json& t) { t["layer_types"].erase(0); },
          "text_config.layer_types has 7 entries, but text_config.num_hidden_layers is 8");
  refused([](json& t) { t["layer_types"] = Repeat({"indexed_attention"}, 8); },
          "text_config.layer_types has no \"linear_attention\" entry");
  refused(
      [](json& t) {
        t.erase("layer_types");
        t["num_hidden_layers"] = int64_t{1} << 20;
      },
      "text_config.num_hidden_layers must be a positive integer (at most 65536), got 1048576");
  json config = Glm5NextConfig();
  config["text_config"] = "none";
  ExpectRefusedWith(config, "text_config is not a JSON object");
}

// Ling-3.0-Flash's shape (BailingHybridConfig): 32 KDA heads of 128, hidden 2560, every 6th layer MLA.
json BailingHybridConfig() {
  return json::parse(R"({
    "model_type": "bailing_hybrid",
    "hidden_size": 2560,
    "num_hidden_layers": 12,
    "rms_norm_eps": 1e-6,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "kv_lora_rank": 512,
    "short_conv_kernel_size": 4,
    "layer_group_size": 6,
    "kda_safe_gate": true,
    "kda_lower_bound": -5.0
  })");
}

TEST(IoConfigTest, ReadsBailingHybridFields) {
  const ModelConfig config = Parse(BailingHybridConfig());
  // The heads' dim is head_dim, not qk_rope_head_dim; layers 5 and 11 are MLA.
  EXPECT_EQ(Summary(config),
            "bailing_hybrid hidden 2560 layers 12 eps 1e-06 heads 32/32/128/128 conv 4 linear 0,1,2,3,4,6,7,8,9,10");
  EXPECT_EQ(Variant(config), "-5.000000 pos \"\"");

  json listed = BailingHybridConfig();
  listed["layer_types"] = Repeat({"full_attention", "linear_attention", "linear_attention"}, 4);
  EXPECT_EQ(Parse(listed).linear_layers, (std::vector<int>{1, 2, 4, 5, 7, 8, 10, 11}));
}

// transformers (5.25) writes a Kimi-Linear config without linear_attn_config: linear_num_heads,
// linear_head_dim, linear_conv_kernel_dim and layer_types, each with KimiLinearConfig's default.
TEST(IoConfigTest, ReadsKimiLinearAsTransformersWritesIt) {
  json config = BaseConfig();
  config.erase("linear_attn_config");
  config["linear_num_heads"] = 4;
  config["linear_head_dim"] = 16;
  config["linear_conv_kernel_dim"] = 3;
  config["layer_types"] = Repeat({"linear_attention", "full_attention"}, 4);
  const ModelConfig written = Parse(config);
  EXPECT_EQ(HeadShape(written), (std::vector<int>{4, 4, 16, 16}));
  EXPECT_EQ(written.conv_size, 3);
  EXPECT_EQ(written.linear_layers, (std::vector<int>{0, 2, 4, 6}));
  config.erase("layer_types");  // every layer but each 4th from layer 4 on
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 3, 5, 6, 7}));
  for (const char* field : {"linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"}) config.erase(field);
  const ModelConfig defaults = Parse(config);
  EXPECT_EQ(HeadShape(defaults), (std::vector<int>{32, 32, 128, 128}));
  EXPECT_EQ(defaults.conv_size, 4);
  // The original checkpoints' linear_attn_config wins over the written fields; layer_types over kda_layers.
  json both = BaseConfig();
  both["linear_num_heads"] = 4;
  both["linear_head_dim"] = 16;
  EXPECT_EQ(HeadShape(Parse(both)), HeadShape(Parse(BaseConfig())));
  both["layer_types"] = Repeat({"full_attention", "linear_attention"}, 4);
  EXPECT_EQ(Parse(both).linear_layers, (std::vector<int>{1, 3, 5, 7}));
  config["num_hidden_layers"] = int64_t{1} << 20;  // an implied list: bounded
  ExpectRefused(config,
                "num_hidden_layers must be a positive integer (at most 65536) without "
                "linear_attn_config.kda_layers, got 1048576");
  config = BaseConfig();
  config["linear_attn_config"] = json::array();
  ExpectRefused(config, "linear_attn_config is not a JSON object");
}

// transformers' save_pretrained writes the KDA shape as linear_* fields and head_dim as the RoPE width.
TEST(IoConfigTest, ReadsBailingHybridAsTransformersWritesIt) {
  json config = BailingHybridConfig();
  config["head_dim"] = 64;
  config["linear_num_heads"] = 32;
  config["linear_head_dim"] = 128;
  config["linear_conv_kernel_dim"] = 4;
  config["short_conv_kernel_size"] = 4;
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{32, 32, 128, 128}));
  config["linear_head_dim"] = 96;
  config["linear_num_heads"] = 16;
  config["linear_conv_kernel_dim"] = 3;
  const ModelConfig written = Parse(config);
  EXPECT_EQ(HeadShape(written), (std::vector<int>{16, 16, 96, 96}));
  EXPECT_EQ(written.conv_size, 3);
  config["linear_head_dim"] = 0;
  ExpectRefusedWith(config, "linear_head_dim must be a positive integer (at most 2147483647), got 0");
}

TEST(IoConfigTest, BailingHybridDefaults) {
  json config = BailingHybridConfig();
  for (const char* field : {"rms_norm_eps", "num_attention_heads", "head_dim", "short_conv_kernel_size",
                            "layer_group_size", "kda_safe_gate", "kda_lower_bound"}) {
    config.erase(field);
  }
  const ModelConfig defaults = Parse(config);
  EXPECT_DOUBLE_EQ(defaults.rms_norm_eps, 1e-6);
  EXPECT_EQ(HeadShape(defaults), (std::vector<int>{32, 32, 128, 128}));
  EXPECT_EQ(defaults.conv_size, 4);
  EXPECT_EQ(Variant(defaults), "-5.000000 pos \"\"");
  EXPECT_EQ(defaults.linear_layers, (std::vector<int>{0, 1, 2, 3, 4, 6, 7, 8, 9, 10}));

  config["layer_group_size"] = 4;
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6, 8, 9, 10}));
  config["layer_group_size"] = 20;  // beyond the last layer: all KDA
  EXPECT_EQ(Parse(config).linear_layers.size(), 12U);
  config["kda_lower_bound"] = -2.5;
  EXPECT_EQ(Variant(Parse(config)), "-2.500000 pos \"\"");
  config["kda_safe_gate"] = false;  // the softplus gate; the bound is not read
  EXPECT_EQ(Variant(Parse(config)), "none pos \"\"");
  config["kda_lower_bound"] = "unused";
  EXPECT_EQ(Variant(Parse(config)), "none pos \"\"");
}

TEST(IoConfigTest, RefusesBadBailingHybridConfigs) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& message) {
    json config = BailingHybridConfig();
    edit(config);
    ExpectRefusedWith(config, message);
  };
  refused([](json& c) { c["kda_safe_gate"] = 1; }, "kda_safe_gate must be true or false, got 1");
  refused([](json& c) { c["kda_lower_bound"] = nullptr; }, "kda_lower_bound must be a number, got null");
  refused([](json& c) { c["kda_lower_bound"] = 0.5; },
          "kda_lower_bound must be finite and < 0 (a lower bound of the log-space gate), got 0.5");
  refused([](json& c) { c["head_dim"] = 0; }, "head_dim must be a positive integer (at most 2147483647), got 0");
  refused([](json& c) { c["num_attention_heads"] = "32"; },
          "num_attention_heads must be a positive integer (at most 2147483647), got \"32\"");
  refused([](json& c) { c["layer_group_size"] = 0; },
          "layer_group_size must be a positive integer (at most 9223372036854775807), got 0");
  refused([](json& c) { c["layer_group_size"] = 1; },
          "no linear_attention layer: without layer_types, layer_group_size = 1 makes every layer full attention "
          "(num_hidden_layers = 12)");
  refused(
      [](json& c) {
        c["layer_types"] = Repeat({"linear_attention", "indexed_attention"}, 6);
      },
      "layer_types entry 1 is \"indexed_attention\", not \"linear_attention\" or \"full_attention\"");
  refused([](json& c) { c["num_hidden_layers"] = 65537; },
          "num_hidden_layers must be a positive integer (at most 65536), got 65537");
  refused([](json& c) { c.erase("num_hidden_layers"); }, "missing num_hidden_layers");
}

// Olmo-Hybrid-7B's shape (OlmoHybridConfig): 30 key and 30 value heads, K 96, V 192, hidden 3840.
json OlmoHybridConfig() {
  json config = json::parse(R"({
    "model_type": "olmo_hybrid",
    "hidden_size": 3840,
    "num_hidden_layers": 8,
    "num_attention_heads": 30,
    "num_key_value_heads": 30,
    "rms_norm_eps": 1e-6,
    "linear_num_key_heads": 30,
    "linear_num_value_heads": 30,
    "linear_key_head_dim": 96,
    "linear_value_head_dim": 192,
    "linear_conv_kernel_dim": 4,
    "linear_allow_neg_eigval": true
  })");
  config["layer_types"] = Repeat({"linear_attention", "linear_attention", "linear_attention", "full_attention"}, 2);
  return config;
}

TEST(IoConfigTest, ReadsOlmoHybridFields) {
  const ModelConfig config = Parse(OlmoHybridConfig());
  // eps as given: the layer's own norm uses 1e-5 regardless.
  EXPECT_EQ(Summary(config), "olmo_hybrid hidden 3840 layers 8 eps 1e-06 heads 30/30/96/192 conv 4 linear 0,1,2,4,5,6");
  EXPECT_EQ(Variant(config), "none neg \"\"");

  json positive = OlmoHybridConfig();
  positive["linear_allow_neg_eigval"] = false;
  EXPECT_EQ(Variant(Parse(positive)), "none pos \"\"");
  positive.erase("linear_allow_neg_eigval");  // default true
  EXPECT_EQ(Variant(Parse(positive)), "none neg \"\"");
  positive.erase("rms_norm_eps");
  EXPECT_DOUBLE_EQ(Parse(positive).rms_norm_eps, 1e-6);
}

TEST(IoConfigTest, OlmoHybridHeadDefaults) {
  json config = OlmoHybridConfig();
  for (const char* field :
       {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"}) {
    config.erase(field);
  }
  // Heads: num_attention_heads; K = int(0.75 * 3840 / 30) = 96; V = 2 K.
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{30, 30, 96, 192}));
  config.erase("num_attention_heads");  // default 30
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{30, 30, 96, 192}));
  config["num_attention_heads"] = 32;  // 0.75 * 3840 / 32 = 90
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{32, 32, 90, 180}));
  config["hidden_size"] = 1000;  // 0.75 * 1000 / 32 = 23.4375, truncated
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{32, 32, 23, 46}));
  config["linear_num_key_heads"] = 16;  // the key dim follows the key heads: 46.875 -> 46
  config["linear_num_value_heads"] = 32;
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{16, 32, 46, 92}));
  config["linear_key_head_dim"] = 64;  // the value dim follows the key dim
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{16, 32, 64, 128}));
  // null is absent (the fields are `int | None` in transformers).
  for (const char* field :
       {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"}) {
    config[field] = nullptr;
  }
  EXPECT_EQ(HeadShape(Parse(config)), (std::vector<int>{32, 32, 23, 46}));
}

TEST(IoConfigTest, OlmoHybridLayerDefaults) {
  json config = OlmoHybridConfig();
  config.erase("layer_types");
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));  // i % 4 == 3: attention
  config["num_hidden_layers"] = 4;
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1, 2}));
  config["num_hidden_layers"] = 3;  // no i % 4 == 3: the last layer is attention
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 1}));
  config["num_hidden_layers"] = 2;
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0}));
  config["num_hidden_layers"] = 1;
  ExpectRefusedWith(config,
                    "no linear_attention layer: without layer_types, the implied list (every 4th layer full attention, "
                    "and the last one when that makes none) makes every layer full attention (num_hidden_layers = 1)");
}

TEST(IoConfigTest, RefusesBadOlmoHybridConfigs) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& message) {
    json config = OlmoHybridConfig();
    edit(config);
    ExpectRefusedWith(config, message);
  };
  refused([](json& c) { c["layer_types"] = Repeat({"linear_attention"}, 8); },
          "layer_types has only \"linear_attention\" entries (the model needs an attention layer too)");
  refused([](json& c) { c["layer_types"][3] = "sliding_attention"; },
          "layer_types entry 3 is \"sliding_attention\", not \"linear_attention\" or \"full_attention\"");
  refused([](json& c) { c["linear_allow_neg_eigval"] = "true"; },
          "linear_allow_neg_eigval must be true or false, got \"true\"");
  refused([](json& c) { c["linear_allow_neg_eigval"] = nullptr; },
          "linear_allow_neg_eigval must be true or false, got null");
  refused([](json& c) { c["linear_num_value_heads"] = 45; },
          "linear_num_value_heads (45) must be a multiple of linear_num_key_heads (30)");
  refused([](json& c) { c["linear_key_head_dim"] = 0; },
          "linear_key_head_dim must be a positive integer (at most 2147483647), got 0");
  refused(
      [](json& c) {
        c.erase("linear_num_key_heads");
        c["num_attention_heads"] = 0;
      },
      "num_attention_heads must be a positive integer (at most 2147483647), got 0");
  refused(
      [](json& c) {
        c.erase("linear_key_head_dim");
        c["hidden_size"] = 32;  // 0.75 * 32 / 30 = 0.8
      },
      "linear_key_head_dim is not given, and its default int(0.75 * hidden_size / linear_num_key_heads) = 0 is not a "
      "positive integer (at most 2147483647)");
  refused(
      [](json& c) {
        c.erase("linear_value_head_dim");
        c["linear_key_head_dim"] = 2000000000;
      },
      "linear_value_head_dim is not given, and its default 2 * linear_key_head_dim = 4000000000 is not a positive "
      "integer (at most 2147483647)");
}

// Lara-4-Mini's shape (LaraMiniConfig): 8 key / 16 value heads of 128, hidden 1024, the period-5 layer pattern.
json LaraMiniConfig() {
  json config = json::parse(R"({
    "model_type": "lara_mini",
    "hidden_size": 1024,
    "num_hidden_layers": 10,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "sliding_window": 512
  })");
  config["layer_types"] =
      Repeat({"linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"}, 2);
  return config;
}

TEST(IoConfigTest, ReadsLaraMiniFields) {
  const ModelConfig config = Parse(LaraMiniConfig());
  EXPECT_EQ(Summary(config), "lara_mini hidden 1024 layers 10 eps 1e-06 heads 8/16/128/128 conv 4 linear 0,2,5,7");
  EXPECT_EQ(Variant(config), "none pos \"\"");

  json defaults = LaraMiniConfig();
  for (const char* field : {"rms_norm_eps", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                            "linear_value_head_dim", "linear_conv_kernel_dim", "layer_types"}) {
    defaults.erase(field);
  }
  defaults["num_hidden_layers"] = 12;
  const ModelConfig lara = Parse(defaults);
  EXPECT_DOUBLE_EQ(lara.rms_norm_eps, 1e-6);
  EXPECT_EQ(HeadShape(lara), (std::vector<int>{8, 16, 128, 128}));
  EXPECT_EQ(lara.conv_size, 4);
  EXPECT_EQ(lara.linear_layers, (std::vector<int>{0, 2, 5, 7, 10}));  // linear, sliding, linear, full, sliding
  defaults["num_hidden_layers"] = 1;
  EXPECT_EQ(Parse(defaults).linear_layers, (std::vector<int>{0}));

  json refused = LaraMiniConfig();
  refused["layer_types"][1] = "indexed_attention";
  ExpectRefusedWith(refused,
                    "layer_types entry 1 is \"indexed_attention\", not \"linear_attention\", \"full_attention\" or "
                    "\"sliding_attention\"");
  refused = LaraMiniConfig();
  refused["linear_key_head_dim"] = nullptr;  // `int` in transformers: null is not the default
  ExpectRefusedWith(refused, "linear_key_head_dim must be a positive integer (at most 2147483647), got null");
  refused = LaraMiniConfig();
  refused.erase("linear_num_key_heads");  // the default 8 must divide the value heads
  refused["linear_num_value_heads"] = 12;
  ExpectRefusedWith(refused, "linear_num_value_heads (12) must be a multiple of linear_num_key_heads (8)");
}

// Qwen4-Exp's shape (Qwen4ExpConfig): the text model under text_config, 16 key / 32 value heads of 128, hidden
// 2048, every 4th layer indexed attention (written "full_attention" in the checkpoint's config).
json Qwen4ExpConfig() {
  return UnderTextConfig("qwen4_exp", json::parse(R"({
    "model_type": "qwen4_exp_text",
    "hidden_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_act": "silu",
    "output_gate_type": "sigmoid",
    "rms_norm_eps": 1e-6,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4
  })"),
                         "full_attention", 1152);
}

TEST(IoConfigTest, ReadsQwen4ExpFields) {
  const ModelConfig config = Parse(Qwen4ExpConfig());
  EXPECT_EQ(Summary(config),
            "qwen4_exp_text hidden 2048 layers 8 eps 1e-06 heads 16/32/128/128 conv 4 linear 0,1,2,4,5,6");
  EXPECT_EQ(Variant(config), "none pos \"sigmoid\"");

  json flat = Qwen4ExpConfig()["text_config"];
  EXPECT_EQ(Parse(flat).model_type, "qwen4_exp_text");
  EXPECT_EQ(Parse(flat).output_gate_activation, "sigmoid");
  json nested = Qwen4ExpConfig();
  nested["text_config"].erase("model_type");
  EXPECT_EQ(Parse(nested).model_type, "qwen4_exp_text");
  nested["text_config"]["layer_types"][7] = "indexed_attention";
  nested["text_config"]["layer_types"][3] = "linear_attention";
  EXPECT_EQ(Parse(nested).linear_layers, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(IoConfigTest, Qwen4ExpDefaultsAndOutputGate) {
  json config = Qwen4ExpConfig();
  json& text = config["text_config"];
  for (const char* field :
       {"rms_norm_eps", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim", "layer_types", "output_gate_type", "hidden_act"}) {
    text.erase(field);
  }
  const ModelConfig defaults = Parse(config);
  EXPECT_DOUBLE_EQ(defaults.rms_norm_eps, 1e-6);
  EXPECT_EQ(HeadShape(defaults), (std::vector<int>{16, 32, 128, 128}));
  EXPECT_EQ(defaults.conv_size, 4);
  EXPECT_EQ(defaults.linear_layers, (std::vector<int>{0, 1, 2, 4, 5, 6}));  // full_attention_interval 4
  EXPECT_EQ(Variant(defaults), "none pos \"silu\"");                        // hidden_act's default
  text["full_attention_interval"] = 2;
  EXPECT_EQ(Parse(config).linear_layers, (std::vector<int>{0, 2, 4, 6}));

  // output_gate_type null, absent or "" (falsy to transformers): hidden_act.
  text["hidden_act"] = "sigmoid";
  EXPECT_EQ(Parse(config).output_gate_activation, "sigmoid");
  text["output_gate_type"] = nullptr;
  EXPECT_EQ(Parse(config).output_gate_activation, "sigmoid");
  text["output_gate_type"] = "";
  EXPECT_EQ(Parse(config).output_gate_activation, "sigmoid");
  text["output_gate_type"] = "silu";
  EXPECT_EQ(Parse(config).output_gate_activation, "silu");
  text["hidden_act"] = "gelu";  // the MLPs' activation: only the output gate's when output_gate_type is unset
  EXPECT_EQ(Parse(config).output_gate_activation, "silu");
}

TEST(IoConfigTest, RefusesBadQwen4ExpConfigs) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& message) {
    json config = Qwen4ExpConfig();
    edit(config["text_config"]);
    ExpectRefusedWith(config, message);
  };
  refused([](json& t) { t["output_gate_type"] = "gelu"; },
          "text_config.output_gate_type must be \"sigmoid\" or \"silu\", got \"gelu\"");
  refused([](json& t) { t["output_gate_type"] = 1; }, "text_config.output_gate_type must be a string or null, got 1");
  refused(
      [](json& t) {
        t["output_gate_type"] = nullptr;
        t["hidden_act"] = "gelu";
      },
      "text_config.hidden_act must be \"sigmoid\" or \"silu\" (the output gate's activation when output_gate_type is "
      "unset), got \"gelu\"");
  refused(
      [](json& t) {
        t.erase("output_gate_type");
        t["hidden_act"] = nullptr;
      },
      "text_config.hidden_act must be a string, got null");
  refused([](json& t) { t["layer_types"][3] = "sliding_attention"; },
          "text_config.layer_types entry 3 is \"sliding_attention\", not \"linear_attention\", \"full_attention\" or "
          "\"indexed_attention\"");
  refused([](json& t) { t["linear_num_value_heads"] = 24; },
          "text_config.linear_num_value_heads (24) must be a multiple of text_config.linear_num_key_heads (16)");
  refused([](json& t) { t["model_type"] = "qwen3_5_text"; },
          "text_config.model_type must be qwen4_exp_text, got \"qwen3_5_text\"");
  refused(
      [](json& t) {
        t.erase("layer_types");
        t["full_attention_interval"] = 1;
      },
      "no linear_attention layer: without text_config.layer_types, text_config.full_attention_interval = 1 makes "
      "every layer full attention (text_config.num_hidden_layers = 8)");
  json config = Qwen4ExpConfig();
  config.erase("text_config");  // unlike glm5_next, Qwen4ExpConfig does not read a flat text model
  ExpectRefusedWith(config, "missing text_config (model_type qwen4_exp keeps the text model there)");
}

// The types without the variant fields leave them at their defaults.
TEST(IoConfigTest, EarlierTypesHaveNoVariantSettings) {
  EXPECT_EQ(Variant(Parse(BaseConfig())), "none pos \"\"");
  EXPECT_EQ(Variant(Parse(QwenNextConfig())), "none pos \"\"");
  EXPECT_EQ(Variant(Parse(Qwen35Config())), "none pos \"\"");
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

// The names the config classes take besides their fields, as transformers 5.25 resolves them: an attribute_map
// alias wins over its field (nemotron_h's layer_types over layers_block_type, granitemoehybrid's
// layers_block_type over layer_types), nemotron_h's older mamba_* names over the fields they stand for.
TEST(IoConfigTest, Mamba2ConfigAliasesAsTransformersResolvesThem) {
  json nemotron = json::parse(R"({"model_type": "nemotron_h", "hidden_size": 64, "mamba_num_heads": 8,
      "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 4, "conv_kernel": 3, "use_conv_bias": true,
      "time_step_limit": [0.0, 1.0], "hybrid_override_pattern": "M-*",
      "layers_block_type": ["mamba", "attention"]})");
  EXPECT_EQ(Summary(Parse(nemotron)), "nemotron_h hidden 64 layers 2 eps 1e-05 heads 4/8/16/16 conv 3 linear 0");
  nemotron["layer_types"] = {"mlp", "mamba", "mamba"};
  nemotron["mamba_n_groups"] = 2;
  nemotron["mamba_d_conv"] = 5;
  nemotron["mamba_dt_limit"] = {0.1, 2.0};
  const ModelConfig legacy = Parse(nemotron);
  EXPECT_EQ(Summary(legacy), "nemotron_h hidden 64 layers 3 eps 1e-05 heads 2/8/16/16 conv 5 linear 1,2");
  EXPECT_DOUBLE_EQ(legacy.dt_min, 0.1);
  EXPECT_DOUBLE_EQ(legacy.dt_max, 2.0);
  nemotron["mamba_conv_bias"] = false;
  ExpectRefusedWith(nemotron, "mamba_conv_bias false (a conv without bias) is not supported");
  nemotron["mamba_conv_bias"] = nullptr;  // null: absent
  nemotron["mamba_n_groups"] = 3;
  ExpectRefusedWith(nemotron, "mamba_num_heads (8) must be a multiple of mamba_n_groups (3)");
  nemotron["mamba_n_groups"] = 2;
  nemotron["mamba_dt_limit"] = {2.0, 0.1};
  ExpectRefusedWith(nemotron, "mamba_dt_limit must satisfy 0 <= min <= max (min finite), got [2.0,0.1]");
  nemotron.erase("mamba_dt_limit");
  nemotron["layer_types"] = {"mlp"};
  ExpectRefusedWith(nemotron, "layer_types has no mamba layer");
  nemotron["layer_types"] = nullptr;  // null: absent
  nemotron.erase("layers_block_type");
  EXPECT_EQ(Parse(nemotron).linear_layers, (std::vector<int>{0}));  // hybrid_override_pattern

  json granite = json::parse(R"({"model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 3,
      "mamba_n_heads": 4, "mamba_d_state": 16, "layer_types": ["mamba", "mamba", "mamba"],
      "layers_block_type": ["mamba", "attention", "mamba"]})");
  EXPECT_EQ(Parse(granite).linear_layers, (std::vector<int>{0, 2}));
  granite["layers_block_type"] = {"mamba"};
  ExpectRefusedWith(granite, "layers_block_type must have num_hidden_layers (3) entries");
  granite.erase("layers_block_type");
  EXPECT_EQ(Parse(granite).linear_layers, (std::vector<int>{0, 1, 2}));
}

// time_step_limit's min must be finite as a float (the layer clamps in float); a max beyond float's range bounds
// nothing (the layer's clamp is +inf, never the undefined conversion of such a double).
TEST(IoConfigTest, Mamba2TimeStepLimitWithinFloatRange) {
  json bamba = json::parse(R"({"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 2,
      "mamba_n_heads": 4, "mamba_d_state": 16, "time_step_limit": [0.001, 1e300]})");
  const ModelConfig huge = Parse(bamba);
  EXPECT_EQ(huge.dt_max, 1e300);
  const DeltaRuleGeometry g = LayerFamilyFor("bamba").geometry(huge);
  EXPECT_EQ(g.dt_min, 0.001F);
  EXPECT_EQ(g.dt_max, std::numeric_limits<float>::infinity());
  bamba["time_step_limit"] = {3.4e38, 3.5e38};
  EXPECT_EQ(LayerFamilyFor("bamba").geometry(Parse(bamba)).dt_max, std::numeric_limits<float>::infinity());
  bamba["time_step_limit"] = {1e39, 1e40};  // finite, but not as a float
  ExpectRefusedWith(bamba, "time_step_limit must satisfy 0 <= min <= max (min finite), got [1e+39,1e+40]");
  bamba["time_step_limit"] = {-0.5, 1.0};
  ExpectRefusedWith(bamba, "time_step_limit must satisfy 0 <= min <= max (min finite), got [-0.5,1.0]");
}

using testing::ErrorOf;

// A Mamba2 config (model_type mamba2; hidden 64, 8 heads of 16, N 16, 2 groups, 2 layers) with `limit` (JSON
// text) as its time_step_limit.
std::string Mamba2WithLimit(const std::string& limit) {
  return R"({"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 8, "head_dim": 16,
      "state_size": 16, "n_groups": 2, "time_step_limit": )" +
         limit + "}";
}

std::string ParseTextError(const std::string& text) {
  return ErrorOf([&] { ParseModelConfig(text, "test-config"); });
}

// transformers 5.25 writes a non-finite float as {"__float__": "Infinity"} (its _encode_special_floats); earlier
// versions, through Python's json, as the bare token Infinity. Both read as the float, as transformers reads them.
TEST(IoConfigTest, ReadsNonFiniteFloatsAsPythonAndTransformersWriteThem) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const std::string limit : {"[0.0, Infinity]", "[0.0,Infinity]", R"([0.0, {"__float__": "Infinity"}])",
                                  R"([0.0,{"__float__":"Infinity"}])"}) {
    SCOPED_TRACE(limit);
    const ModelConfig c = ParseModelConfig(Mamba2WithLimit(limit), "test-config");
    EXPECT_EQ(c.dt_min, 0.0);
    EXPECT_EQ(c.dt_max, inf);
    EXPECT_EQ(c.linear_layers, (std::vector<int>{0, 1}));
  }
  const ModelConfig finite = ParseModelConfig(Mamba2WithLimit("[0.001, 100.0]"), "test-config");
  EXPECT_DOUBLE_EQ(finite.dt_min, 0.001);
  EXPECT_DOUBLE_EQ(finite.dt_max, 100.0);
  EXPECT_EQ(LayerFamilyFor("mamba2").geometry(finite).dt_max, 100.0F);
  // Anywhere in the document: in an unread field, nested, the tokens beside strings that spell them.
  const ModelConfig elsewhere = ParseModelConfig(
      R"({"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 1, "num_heads": 8, "head_dim": 16,
          "n_groups": 2, "NaN": [NaN, -Infinity, {"x": Infinity}], "note": "Infinity, NaN and \"-Infinity\"",
          "tagged": {"__float__": "NaN"}, "time_step_max": -Infinity})",
      "test-config");
  EXPECT_EQ(elsewhere.num_v_heads, 8);
  EXPECT_EQ(elsewhere.dt_max, inf);
}

// Only the three tags decode, and only alone in their object (as in transformers); the tokens only outside strings.
TEST(IoConfigTest, OtherTagsAndStringsStayWhatTheyAre) {
  EXPECT_EQ(ParseTextError(Mamba2WithLimit(R"([0.0, {"__float__": "inf"}])")),
            R"(test-config: time_step_limit must be [min, max], got [0.0,{"__float__":"inf"}])");
  EXPECT_EQ(ParseTextError(Mamba2WithLimit(R"([0.0, {"__float__": "Infinity", "x": 1}])")),
            R"(test-config: time_step_limit must be [min, max], got [0.0,{"__float__":"Infinity","x":1}])");
  EXPECT_EQ(ParseTextError(Mamba2WithLimit(R"([0.0, {"__float__": 1.0}])")),
            R"(test-config: time_step_limit must be [min, max], got [0.0,{"__float__":1.0}])");
  EXPECT_EQ(ParseTextError(Mamba2WithLimit(R"([0.0, "Infinity"])")),
            R"(test-config: time_step_limit must be [min, max], got [0.0,"Infinity"])");
  const std::string act = R"({"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 1, "num_heads": 8,
      "head_dim": 16, "n_groups": 2, "hidden_act": "NaN"})";
  EXPECT_EQ(ParseTextError(act), R"(test-config: hidden_act must be "silu" (the conv's activation), got "NaN")");
  // Not Python's tokens: left to the parser, which refuses them.
  for (const std::string bad :
       {"[0.0, Infinityx]", "[0.0, +Infinity]", "[0.0, infinity]", "[0.0, Inf]", "[0.0, -NaN]", "[0.0, - Infinity]"}) {
    EXPECT_NE(ParseTextError(Mamba2WithLimit(bad)).find("config is not valid JSON"), std::string::npos) << bad;
  }
  // The duplicate check sees through the tagged form.
  EXPECT_NE(ParseTextError(Mamba2WithLimit(R"([0.0, {"__float__": "NaN", "__float__": "NaN"}])"))
                .find("duplicate key '__float__' in a nested object"),
            std::string::npos);
}

// Where a value must be finite, the non-finite ones are refused by the field's name, shown as Python writes them.
TEST(IoConfigTest, FieldsThatMustBeFiniteRefuseNonFiniteFloats) {
  EXPECT_EQ(ParseTextError(Mamba2WithLimit("[Infinity, Infinity]")),
            "test-config: time_step_limit must satisfy 0 <= min <= max (min finite), got [Infinity,Infinity]");
  EXPECT_EQ(ParseTextError(Mamba2WithLimit("[0.0, NaN]")),
            "test-config: time_step_limit must satisfy 0 <= min <= max (min finite), got [0.0,NaN]");
  EXPECT_EQ(ParseTextError(Mamba2WithLimit(R"([{"__float__": "NaN"}, 1.0])")),
            "test-config: time_step_limit must satisfy 0 <= min <= max (min finite), got [NaN,1.0]");
  EXPECT_EQ(ParseTextError(Mamba2WithLimit("[0.0, -Infinity]")),
            "test-config: time_step_limit must satisfy 0 <= min <= max (min finite), got [0.0,-Infinity]");
  const auto with = [](const std::function<void(json&)>& put, const std::string& value) {
    return ParseTextError(ConfigTextWith(put, value));
  };
  const auto eps = [](json& c) { c["rms_norm_eps"] = "@value@"; };
  EXPECT_EQ(with(eps, "Infinity"), "test-config: rms_norm_eps must be > 0, got Infinity");
  EXPECT_EQ(with(eps, "NaN"), "test-config: rms_norm_eps must be > 0, got NaN");
  EXPECT_EQ(with(eps, R"({"__float__": "NaN"})"), "test-config: rms_norm_eps must be > 0, got NaN");
  const auto hidden = [](json& c) { c["hidden_size"] = "@value@"; };
  EXPECT_NE(with(hidden, "Infinity").find("hidden_size must be a positive integer"), std::string::npos);
  const auto heads = [](json& c) { c["linear_attn_config"]["num_heads"] = "@value@"; };
  EXPECT_NE(with(heads, R"({"__float__": "Infinity"})").find("num_heads must be a positive integer"),
            std::string::npos);
  json glm = Glm5NextConfig();
  glm["text_config"]["linear_lower_bound"] = "@value@";
  std::string text = glm.dump();
  text.replace(text.find("\"@value@\""), 9, "-Infinity");
  EXPECT_EQ(ParseTextError(text),
            "test-config: text_config.linear_lower_bound must be finite and < 0 (a lower bound of the log-space "
            "gate), got -Infinity");
  for (const std::string mamba : {R"("layer_norm_epsilon": Infinity)", R"("layer_norm_epsilon": NaN)"}) {
    const std::string config = R"({"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 1,
        "num_heads": 8, "head_dim": 16, "n_groups": 2, )" +
                               mamba + "}";
    EXPECT_NE(ParseTextError(config).find("layer_norm_epsilon must be a finite number > 0"), std::string::npos)
        << mamba;
  }
}

// The four Mamba2 model types' config.json as transformers 5.25's save_pretrained writes them (tiny models:
// python/tests/test_mamba2_families.py; the fields transformers adds that kda does not read left out), and the
// geometry they read.
TEST(IoConfigTest, ReadsMamba2ConfigsAsTransformersWritesThem) {
  const std::string inf = R"({"__float__": "Infinity"})";
  const auto read = [](const std::string& text) { return ParseModelConfig(text, "test-config"); };
  const ModelConfig mamba2 = read(R"({"chunk_size": 16, "conv_kernel": 4, "expand": 2, "head_dim": 16,
      "hidden_act": "silu", "hidden_size": 64, "layer_norm_epsilon": 1e-06, "model_type": "mamba2", "n_groups": 2,
      "num_heads": 8, "num_hidden_layers": 2, "state_size": 16, "time_step_floor": 0.0001,
      "time_step_limit": [0.0, )" +
                                  inf + R"(], "time_step_max": 0.1, "time_step_min": 0.001,
      "time_step_rank": 4, "use_bias": false, "use_conv_bias": true})");
  EXPECT_EQ(Summary(mamba2), "mamba2 hidden 64 layers 2 eps 1e-06 heads 2/8/16/16 conv 4 linear 0,1");
  const ModelConfig nemotron = read(R"({"chunk_size": 16, "conv_kernel": 4, "expand": 2, "head_dim": 32,
      "hidden_size": 96, "layer_norm_epsilon": 1e-06, "layers_block_type": ["linear_attention", "mlp",
      "full_attention", "linear_attention"], "mamba_head_dim": 24, "mamba_hidden_act": "silu",
      "mamba_num_heads": 6, "mamba_proj_bias": false, "model_type": "nemotron_h",
      "mtp_layers_block_type": ["full_attention", "moe"], "n_groups": 2, "ssm_state_size": 32,
      "time_step_limit": [0.0, )" + inf +
                                    R"(], "use_bias": false, "use_conv_bias": true})");
  EXPECT_EQ(Summary(nemotron), "nemotron_h hidden 96 layers 4 eps 1e-06 heads 2/6/32/24 conv 4 linear 0,3");
  const ModelConfig granite = read(R"({"hidden_act": "silu", "hidden_size": 128,
      "layer_types": ["linear_attention", "full_attention"], "mamba_chunk_size": 16, "mamba_conv_bias": true,
      "mamba_d_conv": 4, "mamba_d_head": 32, "mamba_d_state": 32, "mamba_expand": 1, "mamba_n_groups": 1,
      "mamba_n_heads": 4, "mamba_proj_bias": false, "model_type": "granitemoehybrid", "num_hidden_layers": 2,
      "rms_norm_eps": 1e-06, "time_step_limit": [0.0, )" +
                                   inf + "]}");
  EXPECT_EQ(Summary(granite), "granitemoehybrid hidden 128 layers 2 eps 1e-06 heads 1/4/32/32 conv 4 linear 0");
  const ModelConfig bamba = read(R"({"attn_layer_indices": [1], "hidden_act": "silu", "hidden_size": 64,
      "mamba_chunk_size": 16, "mamba_conv_bias": true, "mamba_d_conv": 4, "mamba_d_head": 32, "mamba_d_state": 16,
      "mamba_expand": 2, "mamba_n_groups": 2, "mamba_n_heads": 4, "mamba_proj_bias": false, "model_type": "bamba",
      "num_hidden_layers": 3, "rms_norm_eps": 1e-06, "time_step_limit": [0.0, )" +
                                 inf + "]}");
  EXPECT_EQ(Summary(bamba), "bamba hidden 64 layers 3 eps 1e-06 heads 2/4/16/32 conv 4 linear 0,2");
  for (const ModelConfig* c : {&mamba2, &nemotron, &granite, &bamba}) {
    EXPECT_TRUE(c->ssd);
    EXPECT_EQ(c->dt_min, 0.0);
    EXPECT_EQ(c->dt_max, std::numeric_limits<double>::infinity());
    const DeltaRuleGeometry g = LayerFamilyFor(c->model_type).geometry(*c);
    EXPECT_EQ(g.dt_max, std::numeric_limits<float>::infinity());
  }
}

// Falcon-H1: I = mamba_d_ssm (default 1024; null: mamba_expand * hidden_size), every layer a mixer, the
// multipliers (ssm_in_multiplier times each part of ssm_multipliers, the parts as float32 values) and the norm's
// form into the geometry; biases, a bad multiplier list and a width the heads do not split refused by name.
TEST(IoConfigTest, FalconH1ReadsItsMixerVariants) {
  const auto parse = [](const std::string& text) { return ParseModelConfig(text, "config.json"); };
  const ModelConfig d = parse(R"({"model_type": "falcon_h1", "hidden_size": 256, "num_hidden_layers": 3,
      "mamba_n_heads": 8})");
  EXPECT_EQ(d.linear_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(d.num_v_heads, 8);
  EXPECT_EQ(d.head_v_dim, 128);  // "auto": mamba_d_ssm's default 1024 / 8
  EXPECT_EQ(d.head_k_dim, 256);
  EXPECT_DOUBLE_EQ(d.rms_norm_eps, 1e-5);
  const DeltaRuleGeometry gd = LayerFamilyFor("falcon_h1").geometry(d);
  EXPECT_EQ(gd.ssd_norm, SsdNorm::kGateOnly);  // mamba_rms_norm false
  EXPECT_FALSE(gd.ssd_scaled());
  for (const TensorSpec& t : LayerFamilyFor("falcon_h1").tensors(gd)) EXPECT_NE(t.name, "norm.weight");

  const ModelConfig c = parse(R"({"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 2,
      "mamba_d_ssm": null, "mamba_expand": 2, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16,
      "mamba_n_groups": 2, "mamba_rms_norm": true, "mamba_norm_before_gate": true, "ssm_in_multiplier": 0.5,
      "ssm_multipliers": [1.5, 0.1, 2, 0.25, 3], "mamba_chunk_size": 128, "rms_norm_eps": 1e-6})");
  EXPECT_EQ(c.head_v_dim, 32);
  EXPECT_EQ(c.num_k_heads, 2);
  const DeltaRuleGeometry g = LayerFamilyFor("falcon_h1").geometry(c);
  EXPECT_EQ(g.ssd_norm, SsdNorm::kNormThenGate);
  EXPECT_EQ(g.ssd_multipliers,
            (std::array<float, 5>{0.75F, static_cast<float>(0.5 * double{0.1F}), 1.0F, 0.125F, 1.5F}));
  EXPECT_NO_THROW(g.Validate("falcon"));
  EXPECT_TRUE(c.ssd_rms_norm && c.ssd_norm_before_gate);
  const ModelConfig after = parse(R"({"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 1,
      "mamba_n_heads": 4, "mamba_d_ssm": 128, "mamba_rms_norm": true, "mamba_norm_before_gate": false})");
  EXPECT_EQ(LayerFamilyFor("falcon_h1").geometry(after).ssd_norm, SsdNorm::kGateThenNorm);

  const std::string base = R"({"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 2,
      "mamba_n_heads": 4, "mamba_d_ssm": 128, )";
  const std::pair<std::string, std::string> bad[] = {
      {R"("mamba_proj_bias": true})", "mamba_proj_bias true (biased in_proj and out_proj) is not supported"},
      {R"("projectors_bias": true})", "projectors_bias true (a biased out_proj) is not supported"},
      {R"("ssm_multipliers": [1, 2]})", "ssm_multipliers must be [z, x, B, C, dt] (5 numbers), got [1,2]"},
      {R"("ssm_multipliers": [1, 2, "x", 1, 1]})", "ssm_multipliers must be a finite number, got \"x\""},
      {R"("ssm_in_multiplier": null})", "ssm_in_multiplier must be a finite number, got null"},
      {R"("ssm_in_multiplier": 1e300})", "is beyond float's range"},
      {R"("mamba_d_head": 30})", "mamba_d_ssm (128) must equal mamba_n_heads * mamba_d_head (120)"},
      {R"("mamba_chunk_size": 0})", "mamba_chunk_size"},
  };
  for (const auto& [tail, want] : bad) {
    const std::string e = ParseTextError(base + tail);
    EXPECT_NE(e.find(want), std::string::npos) << tail << ": " << e;
  }
  const std::string e = ParseTextError(R"({"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 2,
      "mamba_n_heads": 5, "mamba_d_ssm": 128})");
  EXPECT_NE(e.find("mamba_d_head is \"auto\", but mamba_d_ssm = 128 is not a multiple of mamba_n_heads"),
            std::string::npos)
      << e;
}

// Zamba2: every layer holds a mixer ("hybrid" ones after the shared attention block), the head dim derived (a
// written mamba_headdim must agree), eps 1e-5 whatever rms_norm_eps, the clamp (time_step_min, inf); the
// 54-layer default pattern; refusals by name.
TEST(IoConfigTest, Zamba2ReadsItsLayoutAndClamp) {
  const auto parse = [](const std::string& text) { return ParseModelConfig(text, "config.json"); };
  const ModelConfig c = parse(R"({"model_type": "zamba2", "hidden_size": 128, "num_hidden_layers": 3,
      "layers_block_type": ["hybrid", "mamba", "linear_attention"], "n_mamba_heads": 4, "mamba_headdim": 64,
      "mamba_d_state": 32, "mamba_ngroups": 2, "time_step_min": 0.02, "rms_norm_eps": 1e-6, "hidden_act": "gelu",
      "use_conv_bias": false})");
  EXPECT_EQ(c.linear_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.head_v_dim, 64);
  EXPECT_EQ(c.num_k_heads, 2);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.dt_min, 0.02);
  EXPECT_EQ(c.dt_max, std::numeric_limits<double>::infinity());
  const LayerFamily& f = LayerFamilyFor("zamba2");
  EXPECT_EQ(f.other_layer_prefixes, (std::vector<std::string>{"mamba_decoder.mamba."}));
  const DeltaRuleGeometry g = f.geometry(c);
  EXPECT_FLOAT_EQ(g.dt_min, 0.02F);
  EXPECT_EQ(g.ssd_norm, SsdNorm::kGateThenNorm);
  const ModelConfig d = parse(R"({"model_type": "zamba2", "hidden_size": 128, "num_hidden_layers": 2,
      "n_mamba_heads": 4, "layer_types": ["mamba", "hybrid"], "layers_block_type": ["mamba"]})");
  EXPECT_EQ(d.num_hidden_layers, 2);  // layer_types wins, as in transformers
  EXPECT_DOUBLE_EQ(d.dt_min, 1e-3);
  EXPECT_EQ(parse(R"({"model_type": "zamba2", "hidden_size": 128, "num_hidden_layers": 2, "n_mamba_heads": 4})")
                .linear_layers.size(),
            54U);
  const std::string base = R"({"model_type": "zamba2", "hidden_size": 128, "num_hidden_layers": 2, )";
  const std::pair<std::string, std::string> bad[] = {
      {R"("n_mamba_heads": 4, "mamba_headdim": 32})",
       "mamba_expand * hidden_size (256) must equal n_mamba_heads * mamba_headdim (128)"},
      {R"("n_mamba_heads": 4, "add_bias_linear": true})",
       "add_bias_linear true (biased in_proj and out_proj) is not supported"},
      {R"("n_mamba_heads": 4, "time_step_min": -1})", "time_step_min must be a finite number >= 0, got -1"},
      {R"("n_mamba_heads": 4, "layers_block_type": ["mamba", "attention"]})",
       "layers_block_type entry 1 is \"attention\""},
      {R"("n_mamba_heads": 3})", "is not a multiple of n_mamba_heads"},
  };
  for (const auto& [tail, want] : bad) {
    const std::string e = ParseTextError(base + tail);
    EXPECT_NE(e.find(want), std::string::npos) << tail << ": " << e;
  }
}

}  // namespace
}  // namespace kda
