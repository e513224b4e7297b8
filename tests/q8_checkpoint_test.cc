// `kda quantize` checkpoints (QuantizeCheckpoint): the round trip gives the
// same Q8 weights as quantizing at load (whole and per tensor-parallel
// shard), and loading refuses corrupted scales and values, and int8 weights
// without the int8 format; writing refuses a non-empty output directory.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "kda/models/quantize.h"
#include "tests/checkpoint_util.h"
#include "tests/distributed_util.h"
#include "tests/error_util.h"
#include "tests/golden.h"
#include "tests/temp_dir.h"

namespace kda {
namespace {

namespace fs = std::filesystem;
using testing::ExpectErrorContaining;

class Q8CheckpointTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    KDA_REQUIRE_GOLDEN_PATH(mini_);
    TempDirTest::SetUp();
    q8_ = (dir_ / "q8").string();
    QuantizeCheckpoint(mini_, q8_);
  }

  const std::string mini_ = testing::GoldenDir() + "/kda-mini";
  std::string q8_;
};

using testing::KdaGeometry;
using testing::LoadKdaLayer;

void ExpectSameQ8(const Q8Weight& a, const Q8Weight& b, const std::string& what) {
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.q, b.q) << what;
  EXPECT_EQ(a.scales, b.scales) << what;
}

TEST_F(Q8CheckpointTest, RoundTripGivesTheWeightsQuantizedAtLoad) {
  const ModelConfig config = LoadModelConfig(mini_);
  const Checkpoint src = Checkpoint::Open(mini_);
  const Checkpoint q8 = Checkpoint::Open(q8_);
  const SafetensorsFile file = SafetensorsFile::Open(q8_ + "/model.safetensors");
  EXPECT_EQ(file.metadata().at("kda_quantization"), "q8_0");
  const DeltaRuleGeometry s = KdaGeometry(config);
  const TensorTable table = LayerFamilyFor("kimi_linear").tensors(s);
  for (int layer : config.linear_layers) {
    const LayerWeights w = LoadKdaLayer(src, config, layer);
    const LayerWeights r = LoadKdaLayer(q8, config, layer);
    ASSERT_FALSE(r.q8.empty());
    const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
    EXPECT_EQ(q8.Get(pre + "q_proj.weight").dtype, DType::kI8);
    EXPECT_EQ(q8.Get(pre + "q_proj.weight_scale").dtype, DType::kF16);
    EXPECT_EQ(q8.Get(pre + "q_proj.weight_scale").shape, (std::vector<int64_t>{s.key_dim(), s.hidden / 32}));
    ExpectSameQ8(r.q8.at("q_proj.weight"), QuantizeQ8(w.Dense("q_proj.weight"), s.key_dim(), s.hidden), "q_proj");
    ExpectSameQ8(r.q8.at("v_proj.weight"), QuantizeQ8(w.Dense("v_proj.weight"), s.key_dim(), s.hidden), "v_proj");
    ExpectSameQ8(r.q8.at("f_b_proj.weight"), QuantizeQ8(w.Dense("f_b_proj.weight"), s.key_dim(), s.K), "f_b_proj");
    ExpectSameQ8(r.q8.at("b_proj.weight"), QuantizeQ8(w.Dense("b_proj.weight"), s.H, s.hidden), "b_proj");
    ExpectSameQ8(r.q8.at("o_proj.weight"), QuantizeQ8(w.Dense("o_proj.weight"), s.hidden, s.key_dim()), "o_proj");
    EXPECT_EQ(r.Dense("q_conv1d.weight"), w.Dense("q_conv1d.weight"));
    EXPECT_EQ(r.Dense("A_log"), w.Dense("A_log"));
    EXPECT_EQ(r.Dense("dt_bias"), w.Dense("dt_bias"));
    EXPECT_EQ(r.Dense("o_norm.weight"), w.Dense("o_norm.weight"));
    // Dequantizing the loaded Q8 weights gives the round trip of the originals.
    const LayerWeights d1 = DequantizeLayerWeights(r, table);
    const LayerWeights d2 = DequantizeLayerWeights(w, table);
    EXPECT_EQ(d1.Dense("g_a_proj.weight"), d2.Dense("g_a_proj.weight"));
    EXPECT_EQ(d1.Dense("k_proj.weight"), d2.Dense("k_proj.weight"));
  }
  // A tensor-parallel rank reads only its slices: the same as slicing the whole.
  const HeadShard shard = MakeHeadShard(s.H, 1, 2);
  const LayerWeights whole = LoadKdaLayer(q8, config, config.linear_layers[0]);
  std::vector<TensorRead> reads;
  const LayerWeights part = LoadKdaLayer(q8, config, config.linear_layers[0], shard, &reads);
  ASSERT_FALSE(part.q8.empty());
  const int64_t p0 = int64_t{shard.begin} * s.K;
  const int64_t p1 = p0 + int64_t{shard.count} * s.K;
  ExpectSameQ8(part.q8.at("q_proj.weight"), SliceQ8(whole.q8.at("q_proj.weight"), p0, p1, 0, s.hidden), "shard q_proj");
  ExpectSameQ8(part.q8.at("o_proj.weight"), SliceQ8(whole.q8.at("o_proj.weight"), 0, s.hidden, p0, p1), "shard o_proj");
  ExpectSameQ8(part.q8.at("f_a_proj.weight"), whole.q8.at("f_a_proj.weight"), "shard f_a_proj");
  int64_t q_bytes = 0;
  for (const TensorRead& r : reads) {
    if (r.name.ends_with("q_proj.weight")) q_bytes += r.end - r.begin;
  }
  EXPECT_EQ(q_bytes, (p1 - p0) * s.hidden);  // its rows only
  // Layers from either source agree exactly: both hold the same Q8 weights.
  const DeltaRuleModel a = DeltaRuleModel::Load(q8_, DType::kBF16, std::nullopt, nullptr, WeightFormat::kInt8);
  const DeltaRuleModel b = DeltaRuleModel::Load(mini_, DType::kBF16, std::nullopt, nullptr, WeightFormat::kInt8);
  ASSERT_EQ(a.num_layers(), b.num_layers());
  EXPECT_EQ(a.layers[0]->projection_weight_bytes(), b.layers[0]->projection_weight_bytes());
  EXPECT_EQ(a.weights_format, WeightFormat::kInt8);
}

TEST_F(Q8CheckpointTest, CorruptedScalesAndValuesAreRefused) {
  const ModelConfig config = LoadModelConfig(mini_);
  const std::string name = "model.layers." + std::to_string(config.linear_layers[0]) + ".self_attn.o_proj.weight";
  int case_no = 0;
  for (const uint16_t bad : {uint16_t{0x7e00}, uint16_t{0x7c00}, uint16_t{0xbc00}}) {
    const std::string dst = (dir_ / ("bad_scale_" + std::to_string(case_no++))).string();
    testing::CopyCheckpointWithRawElement(q8_, dst, name + "_scale", 17, &bad);
    ExpectErrorContaining([&] { DeltaRuleModel::Load(dst, DType::kF32, std::nullopt, nullptr, WeightFormat::kInt8); },
                          "checkpoint tensor " + name + " scale [1, 1] is");
  }
  const int8_t minus128 = -128;
  const std::string dst = (dir_ / "bad_value").string();
  testing::CopyCheckpointWithRawElement(q8_, dst, name, 5, &minus128);
  ExpectErrorContaining([&] { DeltaRuleModel::Load(dst, DType::kF32, std::nullopt, nullptr, WeightFormat::kInt8); },
                        "checkpoint tensor " + name + " element [0, 5] is -128");
  ExpectErrorContaining([&] { DeltaRuleModel::Load(q8_, DType::kBF16); }, "load them with --weights int8");
}

TEST_F(Q8CheckpointTest, WritingRefusesNonEmptyOutputAndInt8Input) {
  ExpectErrorContaining([&] { QuantizeCheckpoint(mini_, q8_); }, "exists and is not empty");
  const std::string again = (dir_ / "again").string();
  ExpectErrorContaining([&] { QuantizeCheckpoint(q8_, again); }, "already holds int8 weights");
  EXPECT_FALSE(fs::exists(again));
  // Nothing half-written beside it either.
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace kda
