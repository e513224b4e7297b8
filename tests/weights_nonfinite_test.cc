// Checkpoint weights holding a NaN or infinity are refused at load, naming the checkpoint key and the element.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "kda/serving/model_runner.h"
#include "tests/checkpoint_util.h"
#include "tests/error_util.h"
#include "tests/golden.h"
#include "tests/temp_dir.h"

namespace kda {
namespace {

namespace fs = std::filesystem;
using testing::ErrorOf;

// Layer `layer`'s KDA weights through the weights loader (the whole layer).
LayerWeights LoadKdaLayer(const Checkpoint& ckpt, const ModelConfig& config, int layer) {
  const DeltaRuleGeometry full = LayerFamilyFor(config.model_type).geometry(config);
  return LoadLayerWeights(ckpt, "model.layers." + std::to_string(layer) + ".self_attn.",
                          LayerFamilyFor("kimi_linear").tensors(full), MakeHeadShard(full.H, 0, 1));
}

class WeightsNonFiniteTest : public testing::TempDirTest {
 protected:
  const std::string mini_ = testing::GoldenDir() + "/kda-mini";
};

TEST_F(WeightsNonFiniteTest, LoadNamesTheKeyAndElement) {
  KDA_REQUIRE_GOLDEN_PATH(mini_);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string key;
    int64_t flat;
    float value;
    std::string expected;
  };
  const Case cases[] = {
      {"model.layers.0.self_attn.q_proj.weight", 513, nan, "(nan) at element [1, 1] (flat index 513)"},
      {"model.layers.1.self_attn.o_proj.weight", 512 * 512 - 1, -inf, "(-inf) at element [511, 511]"},
      {"model.layers.2.self_attn.A_log", 3, inf, "(+inf) at element [0, 0, 3, 0] (flat index 3)"},
      {"model.layers.0.self_attn.q_conv1d.weight", 6, nan, "(nan) at element [1, 0, 2] (flat index 6)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    fs::remove_all(dir_);
    testing::CopyCheckpointWithValue(mini_, dir_.string(), c.key, c.flat, c.value);
    const std::string expected = "checkpoint tensor " + c.key + " has a non-finite value " + c.expected;
    const std::string message = ErrorOf([&] { DeltaRuleModel::Load(dir_.string(), DType::kF32); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    // Through the weights loader directly, for the layer holding the key.
    const int layer = c.key[13] - '0';  // "model.layers.N."
    const ModelConfig config = LoadModelConfig(dir_.string());
    const Checkpoint ckpt = Checkpoint::Open(dir_.string());
    EXPECT_NE(ErrorOf([&] { LoadKdaLayer(ckpt, config, layer); }).find(expected), std::string::npos);
  }
  // A finite change loads.
  fs::remove_all(dir_);
  testing::CopyCheckpointWithValue(mini_, dir_.string(), "model.layers.0.self_attn.q_proj.weight", 5, 0.25F);
  EXPECT_EQ(ErrorOf([&] { DeltaRuleModel::Load(dir_.string(), DType::kF32); }), "(no error)");
}

}  // namespace
}  // namespace kda
