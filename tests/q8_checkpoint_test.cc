// `kda quantize` checkpoints (QuantizeKdaCheckpoint): the round trip gives the
// same Q8 weights as quantizing at load (whole and per tensor-parallel
// shard), and loading refuses corrupted scales and values, and int8 weights
// without the int8 format; writing refuses a non-empty output directory.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"
#include "kda/models/kda_model.h"
#include "kda/models/quantize.h"
#include "kda/models/weights.h"
#include "tests/checkpoint_util.h"
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
    QuantizeKdaCheckpoint(mini_, q8_);
  }

  const std::string mini_ = testing::GoldenDir() + "/kda-mini";
  std::string q8_;
};

void ExpectSameQ8(const Q8Weight& a, const Q8Weight& b, const std::string& what) {
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.q, b.q) << what;
  EXPECT_EQ(a.scales, b.scales) << what;
}

TEST_F(Q8CheckpointTest, RoundTripGivesTheWeightsQuantizedAtLoad) {
  const KimiLinearConfig config = LoadKimiLinearConfig(mini_);
  const Checkpoint src = Checkpoint::Open(mini_);
  const Checkpoint q8 = Checkpoint::Open(q8_);
  const SafetensorsFile file = SafetensorsFile::Open(q8_ + "/model.safetensors");
  EXPECT_EQ(file.metadata().at("kda_quantization"), "q8_0");
  const KdaLayerShape s = KdaLayerShapeFromConfig(config);
  for (int layer : config.kda_layers) {
    const KdaLayerWeights w = LoadKdaLayerWeights(src, config, layer);
    const KdaLayerWeights r = LoadKdaLayerWeights(q8, config, layer);
    ASSERT_TRUE(r.q8.has_value());
    const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
    EXPECT_EQ(q8.Get(pre + "q_proj.weight").dtype, DType::kI8);
    EXPECT_EQ(q8.Get(pre + "q_proj.weight_scale").dtype, DType::kF16);
    EXPECT_EQ(q8.Get(pre + "q_proj.weight_scale").shape, (std::vector<int64_t>{s.P(), s.hidden / 32}));
    ExpectSameQ8(r.q8->q_proj, QuantizeQ8(w.q_proj, s.P(), s.hidden), "q_proj");
    ExpectSameQ8(r.q8->v_proj, QuantizeQ8(w.v_proj, s.P(), s.hidden), "v_proj");
    ExpectSameQ8(r.q8->f_b_proj, QuantizeQ8(w.f_b_proj, s.P(), s.K), "f_b_proj");
    ExpectSameQ8(r.q8->b_proj, QuantizeQ8(w.b_proj, s.H, s.hidden), "b_proj");
    ExpectSameQ8(r.q8->o_proj, QuantizeQ8(w.o_proj, s.hidden, s.P()), "o_proj");
    EXPECT_EQ(r.q_conv, w.q_conv);
    EXPECT_EQ(r.A_log, w.A_log);
    EXPECT_EQ(r.dt_bias, w.dt_bias);
    EXPECT_EQ(r.o_norm, w.o_norm);
    // Dequantizing the loaded Q8 weights gives the round trip of the originals.
    const KdaLayerWeights d1 = DequantizeKdaLayerWeights(r, s);
    const KdaLayerWeights d2 = DequantizeKdaLayerWeights(w, s);
    EXPECT_EQ(d1.g_a_proj, d2.g_a_proj);
    EXPECT_EQ(d1.k_proj, d2.k_proj);
  }
  // A tensor-parallel rank reads only its slices: the same as slicing the whole.
  const KdaHeadShard shard = MakeKdaHeadShard(s.H, 1, 2);
  const KdaLayerWeights whole = LoadKdaLayerWeights(q8, config, config.kda_layers[0]);
  std::vector<TensorRead> reads;
  const KdaLayerWeights part = LoadKdaLayerWeights(q8, config, config.kda_layers[0], shard, &reads);
  ASSERT_TRUE(part.q8.has_value());
  const int64_t p0 = int64_t{shard.begin} * s.K;
  const int64_t p1 = p0 + int64_t{shard.count} * s.K;
  ExpectSameQ8(part.q8->q_proj, SliceQ8(whole.q8->q_proj, p0, p1, 0, s.hidden), "shard q_proj");
  ExpectSameQ8(part.q8->o_proj, SliceQ8(whole.q8->o_proj, 0, s.hidden, p0, p1), "shard o_proj");
  ExpectSameQ8(part.q8->f_a_proj, whole.q8->f_a_proj, "shard f_a_proj");
  int64_t q_bytes = 0;
  for (const TensorRead& r : reads) {
    if (r.name.ends_with("q_proj.weight")) q_bytes += r.end - r.begin;
  }
  EXPECT_EQ(q_bytes, (p1 - p0) * s.hidden);  // its rows only
  // Layers from either source agree exactly: both hold the same Q8 weights.
  const KdaModel a = KdaModel::Load(q8_, DType::kBF16, std::nullopt, nullptr, WeightFormat::kInt8);
  const KdaModel b = KdaModel::Load(mini_, DType::kBF16, std::nullopt, nullptr, WeightFormat::kInt8);
  ASSERT_EQ(a.num_layers(), b.num_layers());
  EXPECT_EQ(a.layers[0].projection_weight_bytes(), b.layers[0].projection_weight_bytes());
  EXPECT_EQ(a.weights_format, WeightFormat::kInt8);
}

TEST_F(Q8CheckpointTest, CorruptedScalesAndValuesAreRefused) {
  const KimiLinearConfig config = LoadKimiLinearConfig(mini_);
  const std::string name = "model.layers." + std::to_string(config.kda_layers[0]) + ".self_attn.o_proj.weight";
  int case_no = 0;
  for (const uint16_t bad : {uint16_t{0x7e00}, uint16_t{0x7c00}, uint16_t{0xbc00}}) {
    const std::string dst = (dir_ / ("bad_scale_" + std::to_string(case_no++))).string();
    testing::CopyCheckpointWithRawElement(q8_, dst, name + "_scale", 17, &bad);
    ExpectErrorContaining([&] { KdaModel::Load(dst, DType::kF32, std::nullopt, nullptr, WeightFormat::kInt8); },
                          "checkpoint tensor " + name + " scale [1, 1] is");
  }
  const int8_t minus128 = -128;
  const std::string dst = (dir_ / "bad_value").string();
  testing::CopyCheckpointWithRawElement(q8_, dst, name, 5, &minus128);
  ExpectErrorContaining([&] { KdaModel::Load(dst, DType::kF32, std::nullopt, nullptr, WeightFormat::kInt8); },
                        "checkpoint tensor " + name + " element [0, 5] is -128");
  ExpectErrorContaining([&] { KdaModel::Load(q8_, DType::kBF16); }, "load them with --weights int8");
}

TEST_F(Q8CheckpointTest, WritingRefusesNonEmptyOutputAndInt8Input) {
  ExpectErrorContaining([&] { QuantizeKdaCheckpoint(mini_, q8_); }, "exists and is not empty");
  const std::string again = (dir_ / "again").string();
  ExpectErrorContaining([&] { QuantizeKdaCheckpoint(q8_, again); }, "already holds int8 weights");
  EXPECT_FALSE(fs::exists(again));
  // Nothing half-written beside it either.
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace kda
