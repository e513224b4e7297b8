// The layer families as data: every golden set loads through its config's
// model_type into the right geometry and layer; tensor tables shard a value
// head with its key head (a rank's load equals the cut of the whole layer);
// what loading refuses (unsupported model types, dims that disagree with the
// weights, missing and extra tensors) is refused by name; Qwen3.5's
// multimodal key prefix loads the same weights.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "tests/checkpoint_util.h"
#include "tests/error_util.h"
#include "tests/golden.h"
#include "tests/temp_dir.h"

namespace kda {
namespace {

using testing::ErrorOf;

struct SetFacts {
  const char* set;
  const char* model_type;  // the family's name
  int H, HV, K, V;
};

const SetFacts kSets[] = {
    {"kda-mini", "kimi_linear", 4, 4, 128, 128},
    {"gdn-mini", "qwen3_next", 4, 8, 32, 32},
    {"gdn-gva3", "qwen3_5_text", 2, 6, 64, 48},
    {"gdn-loud", "qwen3_next", 2, 4, 128, 128},
};

TEST(LayerFamily, GoldenSetsLoadThroughTheirModelType) {
  for (const SetFacts& f : kSets) {
    const std::string dir = testing::GoldenSetDir(f.set);
    KDA_REQUIRE_GOLDEN_PATH(dir);
    const DeltaRuleModel m = DeltaRuleModel::Load(dir, DType::kF32);
    EXPECT_EQ(m.model_type, f.model_type) << f.set;
    EXPECT_EQ(m.num_layers(), 3) << f.set;
    EXPECT_EQ(m.geometry.H, f.H) << f.set;
    EXPECT_EQ(m.geometry.HV, f.HV) << f.set;
    EXPECT_EQ(m.geometry.K, f.K) << f.set;
    EXPECT_EQ(m.geometry.V, f.V) << f.set;
    const bool gdn = std::string(f.model_type) != "kimi_linear";
    EXPECT_EQ(m.geometry.decay, gdn ? DecayWidth::kPerValueHead : DecayWidth::kPerKeyDim) << f.set;
    EXPECT_EQ(m.geometry.output_gate, gdn ? GateActivation::kSilu : GateActivation::kSigmoid) << f.set;
    const RecurrentStateSpec s = m.state_spec();
    EXPECT_EQ(s.recurrent_size(), int64_t{f.HV} * f.K * f.V) << f.set;
    EXPECT_EQ(s.conv_channels, 2 * f.H * f.K + f.HV * f.V) << f.set;
    EXPECT_EQ(s.verify_row, s.conv_channels + (gdn ? f.HV : int64_t{f.HV} * f.K) + f.HV) << f.set;
    EXPECT_EQ(m.family().layer_class,
              std::string(
                  gdn ? (f.model_type == std::string("qwen3_next") ? "Qwen3NextGatedDeltaNet" : "Qwen3_5GatedDeltaNet")
                      : "KimiDeltaAttention"));
  }
}

TEST(LayerFamily, EveryModelTypeHasOneFamilyAndUnsupportedOnesAreNamed) {
  for (const std::string& t : SupportedModelTypes()) EXPECT_NO_THROW(LayerFamilyFor(t)) << t;
  const std::string e = ErrorOf([] { LayerFamilyFor("jamba"); });
  EXPECT_NE(e.find("unsupported model_type \"jamba\""), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3_next"), std::string::npos) << e;
  const std::string r =
      ErrorOf([] { DeltaRuleModel::Random("llama", DeltaRuleGeometry::Kda(64, 2, 16, 4, 1e-5), 1, DType::kF32, 1); });
  EXPECT_NE(r.find("unsupported model_type \"llama\""), std::string::npos) << r;
}

TEST(LayerFamily, BadGeometriesAreRefusedByName) {
  DeltaRuleGeometry g = DeltaRuleGeometry::Gdn(64, 2, 5, 16, 16, 4, 1e-6);
  std::string e = ErrorOf([&] { DeltaRuleModel::Random("qwen3_next", g, 1, DType::kF32, 1); });
  EXPECT_NE(e.find("value heads (5) must be a multiple of the key heads (2)"), std::string::npos) << e;
  g = DeltaRuleGeometry::Gdn(64, 2, 4, 16, 16, 4, 1e-6);
  e = ErrorOf([&] { DeltaRuleModel::Random("kimi_linear", g, 1, DType::kF32, 1); });
  EXPECT_NE(e.find("KDA"), std::string::npos) << e;
}

// A rank's load of its key heads equals the whole layer's weights cut by the
// same table, for every tp size that divides the key heads.
TEST(LayerFamily, ShardedLoadsEqualTheCutOfTheWholeLayer) {
  for (const SetFacts& f : kSets) {
    const std::string dir = testing::GoldenSetDir(f.set);
    KDA_REQUIRE_GOLDEN_PATH(dir);
    const ModelConfig config = LoadModelConfig(dir);
    const LayerFamily& family = LayerFamilyFor(config.model_type);
    const DeltaRuleGeometry full = family.geometry(config);
    const TensorTable table = family.tensors(full);
    const Checkpoint ckpt = Checkpoint::Open(dir);
    const std::string prefix = LayerKeyPrefix(ckpt, family, 1);
    const LayerWeights whole = LoadLayerWeights(ckpt, prefix, table, MakeHeadShard(full.H, 0, 1));
    for (int tp = 2; tp <= full.H; tp *= 2) {
      for (int rank = 0; rank < tp; ++rank) {
        const HeadShard shard = MakeHeadShard(full.H, rank, tp);
        std::vector<TensorRead> reads;
        const LayerWeights part = LoadLayerWeights(ckpt, prefix, table, shard, &reads);
        const LayerWeights cut = ShardLayerWeights(whole, table, shard);
        const DeltaRuleGeometry g = full.Shard(shard.begin, shard.count);
        const TensorTable local = family.tensors(g);
        for (const TensorSpec& t : local) {
          ASSERT_EQ(part.Dense(t.name), cut.Dense(t.name))
              << f.set << " tp " << tp << " rank " << rank << " " << t.name;
          EXPECT_EQ(static_cast<int64_t>(part.Dense(t.name).size()), t.numel()) << f.set << " " << t.name;
        }
        // The shard builds a layer of its geometry.
        EXPECT_NO_THROW(family.MakeLayer(0, g, part, DType::kF32, nullptr, WeightFormat::kDense)) << f.set;
        // It read less than the whole of every cut tensor.
        int64_t read = 0;
        for (const TensorRead& r : reads) read += r.end - r.begin;
        int64_t total = 0;
        for (const TensorSpec& t : table) total += t.numel();
        EXPECT_LT(read, total) << f.set << " tp " << tp;
      }
    }
  }
}

// Qwen3-Next's interleaved groups and Qwen3.5's flat layout are the same
// layer: gdn-mini's weights rewritten in the flat layout (and under the
// multimodal prefix) give the same output.
class FamilyFilesTest : public testing::TempDirTest {
 protected:
  // Runs layer 0 of the model in `dir` over `x` [T, hidden] (one sequence, fp32).
  static std::vector<float> RunLayer(const std::string& dir, const std::vector<float>& x) {
    const DeltaRuleModel m = DeltaRuleModel::Load(dir, DType::kF32, 0);
    RecurrentStatePool pool(1, 1, m.state_spec(), DType::kF32);
    HybridReqToTokenPool req(&pool);
    DeltaRuleAttnBackend backend({&pool, &req}, KernelImpl::kReference);
    const auto T = static_cast<int64_t>(x.size()) / m.geometry.hidden;
    ForwardBatch b;
    b.mode = ForwardMode::kExtend;
    b.req_ids = {0};
    b.req_pool_indices = {req.Alloc(0)};
    b.extend_lens = {T};
    b.prefix_lens = {0};
    backend.InitForwardMetadata(b);
    std::vector<float> out(x.size());
    m.layers[0]->Forward({out.data(), DType::kF32}, {x.data(), DType::kF32}, backend);
    return out;
  }

  static std::string ReadText(const std::filesystem::path& p) {
    std::ifstream f(p);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  static void WriteText(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }
};

TEST_F(FamilyFilesTest, Qwen3NextAndQwen35LayoutsAreTheSameLayer) {
  const std::string mini = testing::GoldenSetDir("gdn-mini");
  KDA_REQUIRE_GOLDEN_PATH(mini);
  // gdn-mini: H 4, r 2, K = V = 32, hidden 256.
  const int64_t H = 4, r = 2, K = 32, V = 32, hid = 256;
  const SafetensorsFile src = SafetensorsFile::Open(mini + "/model.safetensors");
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> out;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    keep.push_back(std::move(v));
    out.push_back({name, DType::kF32, std::move(shape), nullptr});
  };
  for (const TensorInfo& t : src.tensors()) {
    const std::string pre = t.name.substr(0, t.name.find("linear_attn.") + 12);
    const std::string mm =
        "model.language_model." + pre.substr(6);  // model.layers.i. -> model.language_model.layers.i.
    const std::string rest = t.name.substr(pre.size());
    const std::vector<float> w = ToFloatVector(t);
    if (rest == "in_proj_qkvz.weight") {
      const int64_t G = 2 * K + 2 * r * V;
      std::vector<float> qkv, z;
      const int64_t starts[3] = {0, K, 2 * K};
      const int64_t widths[3] = {K, K, r * V};
      for (int part = 0; part < 3; ++part) {
        for (int64_t i = 0; i < H; ++i) {
          qkv.insert(qkv.end(), w.begin() + (i * G + starts[part]) * hid,
                     w.begin() + (i * G + starts[part] + widths[part]) * hid);
        }
      }
      for (int64_t i = 0; i < H; ++i)
        z.insert(z.end(), w.begin() + (i * G + 2 * K + r * V) * hid, w.begin() + (i + 1) * G * hid);
      add(mm + "in_proj_qkv.weight", {static_cast<int64_t>(qkv.size()) / hid, hid}, qkv);
      add(mm + "in_proj_z.weight", {static_cast<int64_t>(z.size()) / hid, hid}, z);
    } else if (rest == "in_proj_ba.weight") {
      std::vector<float> b, a;
      for (int64_t i = 0; i < H; ++i) {
        b.insert(b.end(), w.begin() + (i * 2 * r) * hid, w.begin() + (i * 2 * r + r) * hid);
        a.insert(a.end(), w.begin() + (i * 2 * r + r) * hid, w.begin() + (i + 1) * 2 * r * hid);
      }
      add(mm + "in_proj_b.weight", {H * r, hid}, b);
      add(mm + "in_proj_a.weight", {H * r, hid}, a);
    } else {
      add(mm + rest, t.shape, w);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = keep[i].data();
  const std::filesystem::path flat = dir_ / "flat";
  std::filesystem::create_directories(flat);
  WriteSafetensors((flat / "model.safetensors").string(), out, {{"format", "pt"}});
  // The Qwen3.5 config: nested text_config, the same numbers.
  std::string cfg = ReadText(std::filesystem::path(mini) / "config.json");
  const size_t at = cfg.find("\"qwen3_next\"");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 12, "\"qwen3_5_text\"");
  WriteText(flat / "config.json", "{\"model_type\": \"qwen3_5\", \"text_config\": " + cfg + "}");

  const DeltaRuleModel m = DeltaRuleModel::Load(flat.string(), DType::kF32);
  EXPECT_EQ(m.model_type, "qwen3_5_text");
  std::vector<float> x(static_cast<size_t>(5 * hid));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 50.0F - 1.0F;
  EXPECT_EQ(RunLayer(flat.string(), x), RunLayer(mini, x));
}

TEST_F(FamilyFilesTest, DimsThatDisagreeWithTheWeightsAreRefusedByName) {
  const std::string mini = testing::GoldenSetDir("gdn-mini");
  KDA_REQUIRE_GOLDEN_PATH(mini);
  std::string cfg = ReadText(std::filesystem::path(mini) / "config.json");
  const std::string key = "\"linear_value_head_dim\": 32";
  const size_t at = cfg.find(key);
  ASSERT_NE(at, std::string::npos) << cfg;
  cfg.replace(at, key.size(), "\"linear_value_head_dim\": 16");
  testing::CopyCheckpoint(mini, (dir_ / "v16").string(), [](const TensorInfo&, testing::TensorCopy&) {});
  WriteText(dir_ / "v16" / "config.json", cfg);
  const std::string e = ErrorOf([&] { DeltaRuleModel::Load((dir_ / "v16").string(), DType::kF32); });
  EXPECT_NE(e.find("tensor model.layers.0.linear_attn.in_proj_qkvz.weight has shape [768, 256], expected [512, 256]"),
            std::string::npos)
      << e;
}

TEST_F(FamilyFilesTest, MissingAndExtraTensorsAreRefusedByName) {
  const std::string mini = testing::GoldenSetDir("gdn-mini");
  KDA_REQUIRE_GOLDEN_PATH(mini);
  // Missing: a copy without layer 1's dt_bias.
  {
    const SafetensorsFile src = SafetensorsFile::Open(mini + "/model.safetensors");
    std::vector<TensorToWrite> out;
    for (const TensorInfo& t : src.tensors()) {
      if (t.name != "model.layers.1.linear_attn.dt_bias") out.push_back({t.name, t.dtype, t.shape, t.data});
    }
    std::filesystem::create_directories(dir_ / "missing");
    std::filesystem::copy_file(mini + "/config.json", dir_ / "missing" / "config.json");
    WriteSafetensors((dir_ / "missing" / "model.safetensors").string(), out, {});
    const std::string e = ErrorOf([&] { DeltaRuleModel::Load((dir_ / "missing").string(), DType::kF32); });
    EXPECT_NE(e.find("missing tensor model.layers.1.linear_attn.dt_bias"), std::string::npos) << e;
  }
  // Extra: a bias the layer does not have.
  {
    const SafetensorsFile src = SafetensorsFile::Open(mini + "/model.safetensors");
    std::vector<TensorToWrite> out;
    for (const TensorInfo& t : src.tensors()) out.push_back({t.name, t.dtype, t.shape, t.data});
    const std::vector<float> bias(512, 0.0F);
    out.push_back({"model.layers.2.linear_attn.conv1d.bias", DType::kF32, {512}, bias.data()});
    std::filesystem::create_directories(dir_ / "extra");
    std::filesystem::copy_file(mini + "/config.json", dir_ / "extra" / "config.json");
    WriteSafetensors((dir_ / "extra" / "model.safetensors").string(), out, {});
    const std::string e = ErrorOf([&] { DeltaRuleModel::Load((dir_ / "extra").string(), DType::kF32); });
    EXPECT_NE(e.find("model.layers.2.linear_attn.conv1d.bias is not a tensor of this layer type"), std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace kda
