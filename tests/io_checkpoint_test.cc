#include "kda/io/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kda/base/error.h"
#include "kda/io/safetensors.h"
#include "tests/golden.h"
#include "tests/temp_dir.h"

namespace kda {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public testing::TempDirTest {
 protected:
  // Two shards: a, b in shard 1 of 2; c in shard 2 of 2.
  void WriteShards() {
    WriteSafetensors((dir_ / "model-00001-of-00002.safetensors").string(),
                     {{"a", DType::kF32, {2}, a_}, {"b", DType::kI64, {1}, b_}});
    WriteSafetensors((dir_ / "model-00002-of-00002.safetensors").string(), {{"c", DType::kI32, {3}, c_}});
  }

  void WriteIndex(const nlohmann::json& weight_map) {
    const nlohmann::json index = {{"metadata", {{"total_size", 28}}}, {"weight_map", weight_map}};
    std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(2);
  }

  static nlohmann::json GoodWeightMap() {
    return {{"a", "model-00001-of-00002.safetensors"},
            {"b", "model-00001-of-00002.safetensors"},
            {"c", "model-00002-of-00002.safetensors"}};
  }

  // The message of the kda::Error that Checkpoint::Open(dir_) throws.
  std::string OpenError() const {
    try {
      Checkpoint::Open(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  // OpenError() for the two shards indexed by GoodWeightMap() with the entry
  // for `tensor` naming `shard`.
  std::string OpenErrorWithEntry(const std::string& tensor, const std::string& shard) {
    WriteShards();
    nlohmann::json weight_map = GoodWeightMap();
    weight_map[tensor] = shard;
    WriteIndex(weight_map);
    return OpenError();
  }

  const float a_[2] = {1.0F, -2.0F};
  const int64_t b_[1] = {9};
  const int32_t c_[3] = {4, 5, 6};
};

TEST_F(CheckpointTest, ShardedRoundTrip) {
  WriteShards();
  WriteIndex(GoodWeightMap());
  const Checkpoint checkpoint = Checkpoint::Open(dir_.string());
  EXPECT_EQ(checkpoint.dir(), dir_.string());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(checkpoint.Has("c"));
  EXPECT_FALSE(checkpoint.Has("d"));
  EXPECT_EQ(ToFloatVector(checkpoint.Get("a")), (std::vector<float>{1.0F, -2.0F}));
  EXPECT_EQ(ToInt64Vector(checkpoint.Get("b")), (std::vector<int64_t>{9}));
  EXPECT_EQ(checkpoint.Get("c").dtype, DType::kI32);
  EXPECT_EQ(ToInt64Vector(checkpoint.Get("c")), (std::vector<int64_t>{4, 5, 6}));
  try {
    checkpoint.Get("d");
    ADD_FAILURE() << "found a tensor that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "tensor 'd' not found in checkpoint " + dir_.string());
  }

  // Moving keeps the tensors valid.
  Checkpoint source = Checkpoint::Open(dir_.string());
  const Checkpoint target = std::move(source);
  EXPECT_EQ(ToFloatVector(target.Get("a")), (std::vector<float>{1.0F, -2.0F}));
}

TEST_F(CheckpointTest, SingleFile) {
  WriteSafetensors((dir_ / "model.safetensors").string(), {{"w", DType::kF32, {2}, a_}});
  const Checkpoint checkpoint = Checkpoint::Open(dir_.string());
  EXPECT_EQ(checkpoint.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(ToFloatVector(checkpoint.Get("w")), (std::vector<float>{1.0F, -2.0F}));
}

TEST_F(CheckpointTest, IndexTakesPrecedenceOverSingleFile) {
  WriteShards();
  WriteIndex(GoodWeightMap());
  WriteSafetensors((dir_ / "model.safetensors").string(), {{"w", DType::kF32, {2}, a_}});
  const Checkpoint checkpoint = Checkpoint::Open(dir_.string());
  EXPECT_TRUE(checkpoint.Has("a"));
  EXPECT_FALSE(checkpoint.Has("w"));
}

TEST_F(CheckpointTest, RefusesEmptyDirectory) {
  EXPECT_EQ(OpenError(), "no model.safetensors or model.safetensors.index.json in " + dir_.string());
}

TEST_F(CheckpointTest, RefusesMissingShard) {
  const std::string message = OpenErrorWithEntry("c", "model-00003-of-00002.safetensors");
  EXPECT_NE(message.find("weight_map entry for tensor 'c': shard file"), std::string::npos) << message;
  EXPECT_NE(message.find("model-00003-of-00002.safetensors does not exist or is not a regular file"), std::string::npos)
      << message;
}

TEST_F(CheckpointTest, RefusesTensorMissingFromShard) {
  const std::string message = OpenErrorWithEntry("d", "model-00002-of-00002.safetensors");
  EXPECT_NE(message.find("tensor 'd' is listed in shard 'model-00002-of-00002.safetensors' but missing from it"),
            std::string::npos)
      << message;
}

TEST_F(CheckpointTest, RefusesPathTraversalInShardName) {
  WriteShards();
  fs::create_directories(dir_ / "sub");
  WriteSafetensors((dir_ / "sub" / "x.safetensors").string(), {{"a", DType::kF32, {2}, a_}});
  for (const char* bad : {"../model-00001-of-00002.safetensors", "sub/x.safetensors", "/etc/passwd", "..", ""}) {
    WriteIndex({{"a", bad}});
    const std::string message = OpenError();
    EXPECT_NE(message.find("shard name '" + std::string(bad) + "' is not a plain file name"), std::string::npos)
        << message;
  }
}

TEST_F(CheckpointTest, RefusesMalformedIndex) {
  WriteShards();
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"metadata": {}})";
  EXPECT_NE(OpenError().find("missing weight_map"), std::string::npos);
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": []})";
  EXPECT_NE(OpenError().find("weight_map is not a JSON object"), std::string::npos);
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"a": 3}})";
  EXPECT_NE(OpenError().find("weight_map entry for tensor 'a' is not a string"), std::string::npos);
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "a": "model-00002-of-00002.safetensors"}})";
  EXPECT_NE(OpenError().find("duplicate key 'a'"), std::string::npos);
  std::ofstream(dir_ / "model.safetensors.index.json") << "{";
  EXPECT_NE(OpenError().find("index is not valid JSON"), std::string::npos);
}

TEST(CheckpointGoldenTest, OpensTheGoldenCheckpoint) {
  const std::string dir = ::kda::testing::GoldenDir() + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(dir + "/model.safetensors");
  const Checkpoint checkpoint = Checkpoint::Open(dir);
  EXPECT_EQ(checkpoint.names().size(), 45U);  // 15 tensors for each of 3 KDA layers
  const TensorInfo& q = checkpoint.Get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype, DType::kBF16);
  EXPECT_EQ(q.shape, (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(q.nbytes, 512U * 512U * 2U);
  EXPECT_EQ(checkpoint.Get("model.layers.2.self_attn.A_log").shape, (std::vector<int64_t>{1, 1, 4, 1}));
  EXPECT_EQ(ToFloatVector(checkpoint.Get("model.layers.1.self_attn.o_norm.weight")).size(), 128U);
  EXPECT_FALSE(checkpoint.Has("model.layers.3.self_attn.q_proj.weight"));  // layer 4 is full attention
}

TEST(CheckpointGoldenTest, OpensAGoldenCaseFile) {
  const std::string path = ::kda::testing::GoldenDir() + "/kda-mini/single_T8.safetensors";
  KDA_REQUIRE_GOLDEN_PATH(path);
  const SafetensorsFile file = SafetensorsFile::Open(path);
  EXPECT_EQ(ToInt64Vector(file.Get("cu_seqlens")), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(file.Get("hidden_states").shape, (std::vector<int64_t>{8, 512}));
  EXPECT_EQ(file.metadata().at("case"), "single_T8");
}

}  // namespace
}  // namespace kda

namespace kda {
namespace {

// The index, like every JSON the component reads, is refused when nested deeper than 64 levels (a deep value
// used to overflow the stack when an error message formatted it).
TEST_F(CheckpointTest, RefusesDeeplyNestedIndex) {
  WriteShards();
  const std::string deep = std::string(66000, '[') + std::string(66000, ']');
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"metadata": {"x": )" << deep << R"(}, "weight_map": {}})";
  EXPECT_NE(OpenError().find("model.safetensors.index.json: index nests arrays or objects deeper than 64 levels"),
            std::string::npos)
      << OpenError();
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"a": )" << std::string(40, '[') << "1" << std::string(40, ']') << "}}";
  EXPECT_NE(OpenError().find("weight_map entry for tensor 'a' is not a string"), std::string::npos) << OpenError();
}

}  // namespace
}  // namespace kda
