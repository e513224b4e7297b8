// Tensor/data parallelism in one process: the single-process communicator,
// head shards and sharded loading (each rank reads only its slices), the
// shard <-> full state layouts, the request split, and the refusals that need
// no MPI (the multi-process runs are tests/distributed_mpi_test.cc and
// tests/distributed_cli_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "kda/distributed/communicator.h"
#include "kda/distributed/mpi_communicator.h"
#include "kda/distributed/parallel_groups.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "kda/serving/parallel.h"
#include "tests/distributed_util.h"
#include "tests/error_util.h"
#include "tests/golden.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::ErrorOf;

TEST(SingleProcessCommunicator, EveryCollectiveIsTheIdentity) {
  SingleProcessCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> v = {1.5F, -2.0F};
  c.AllReduceSum(v.data(), 2);
  EXPECT_EQ(v, (std::vector<float>{1.5F, -2.0F}));
  std::vector<BF16> b = {ToBF16(3.0F)};
  c.AllReduceSumBF16(b.data(), 1);
  EXPECT_EQ(ToFloat(b[0]), 3.0F);
  const uint8_t bytes[3] = {1, 2, 3};
  EXPECT_EQ(c.Gather(bytes, 3, 0), (std::vector<std::vector<uint8_t>>{{1, 2, 3}}));
  int x = 5;
  c.Broadcast(&x, sizeof(x), 0);
  EXPECT_EQ(x, 5);
  c.Barrier();
  EXPECT_EQ(c.Split(3, 1)->size(), 1);
  EXPECT_NE(ErrorOf([&] { c.Gather(bytes, 3, 1); }).find("root 1"), std::string::npos);
}

TEST(TimedCommunicator, CountsAllReducesAndForwardsTheRest) {
  SingleProcessCommunicator inner;
  TimedCommunicator t(&inner);
  std::vector<float> v(10, 1.0F);
  std::vector<BF16> b(4);
  t.AllReduceSum(v.data(), 10);
  t.AllReduceSumBF16(b.data(), 4);
  EXPECT_EQ(t.allreduce_calls(), 2);
  EXPECT_EQ(t.allreduce_bytes(), 10 * 4 + 4 * 2);
  EXPECT_GE(t.allreduce_seconds(), 0.0);
  EXPECT_EQ(t.Gather(v.data(), 4, 0).size(), 1U);
  t.ResetStats();
  EXPECT_EQ(t.allreduce_calls(), 0);
}

// The AllReduceSumBF16 every implementation inherits: fp32 sums, one rounding.
TEST(Communicator, Bf16AllReduceRoundsTheFp32SumOnce) {
  class Doubling : public Communicator {  // as if two ranks held the same values
   public:
    int rank() const override { return 0; }
    int size() const override { return 2; }
    void AllReduceSum(float* data, int64_t n) override {
      for (int64_t i = 0; i < n; ++i) data[i] *= 2.0F;
    }
    std::vector<std::vector<uint8_t>> Gather(const void* /*data*/, int64_t /*nbytes*/, int /*root*/) override {
      return {};
    }
    void Broadcast(void* /*data*/, int64_t /*nbytes*/, int /*root*/) override {}
    void Barrier() override {}
    std::unique_ptr<Communicator> Split(int /*color*/, int /*key*/) override { return nullptr; }
  };
  Doubling c;
  std::vector<BF16> b = {ToBF16(1.0078125F), ToBF16(-3.0F)};
  c.AllReduceSumBF16(b.data(), 2);
  EXPECT_EQ(ToFloat(b[0]), 2.015625F);
  EXPECT_EQ(ToFloat(b[1]), -6.0F);
}

// ------------------------------------------------------------------ shards

TEST(HeadShard, SplitsHeadsEvenlyOrRefuses) {
  const HeadShard s = MakeHeadShard(32, 3, 4);
  EXPECT_EQ(s.begin, 24);
  EXPECT_EQ(s.count, 8);
  EXPECT_EQ(s.total, 32);
  const std::string e = ErrorOf([] { MakeHeadShard(4, 0, 3); });
  EXPECT_NE(e.find("4 heads"), std::string::npos) << e;
  EXPECT_NE(e.find("--tp 3"), std::string::npos) << e;
  EXPECT_NE(ErrorOf([] { MakeHeadShard(4, 2, 2); }).find("out of range"), std::string::npos);
  const DeltaRuleGeometry full = DeltaRuleGeometry::Kda(/*hidden=*/64, /*heads=*/4, /*head_dim=*/16,
                                                        /*conv_width=*/4, /*eps=*/1e-5);
  const HeadShard half = MakeHeadShard(4, 1, 2);
  EXPECT_EQ(full.Shard(half.begin, half.count).H, 2);
}

// Each tp rank reads exactly its slices (rows of its heads; o_proj's input
// columns of its heads; f_a/g_a/o_norm whole), and its values are the
// corresponding slices of the full weights.
TEST(ShardedLoading, EachRankReadsOnlyItsSlices) {
  const std::string dir = testing::GoldenDir() + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(dir);
  const ModelConfig config = LoadModelConfig(dir);
  const DeltaRuleGeometry full = testing::KdaGeometry(config);
  const TensorTable table = LayerFamilyFor("kimi_linear").tensors(full);
  const Checkpoint ckpt = Checkpoint::Open(dir);
  std::vector<TensorRead> all_reads;
  const LayerWeights all = testing::LoadKdaLayer(ckpt, config, 0, MakeHeadShard(full.H, 0, 1), &all_reads);
  EXPECT_EQ(testing::ByTensor(all_reads), testing::ExpectedShardReads(0, full, MakeHeadShard(full.H, 0, 1)));
  EXPECT_EQ(all.Dense("o_proj.weight"), testing::LoadKdaLayer(ckpt, config, 0).Dense("o_proj.weight"));
  for (int tp : {2, 4}) {
    std::map<std::string, int64_t> read_per_tensor;
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const HeadShard shard = MakeHeadShard(full.H, rank, tp);
      std::vector<TensorRead> reads;
      const LayerWeights w = testing::LoadKdaLayer(ckpt, config, 0, shard, &reads);
      EXPECT_EQ(testing::ByTensor(reads), testing::ExpectedShardReads(0, full, shard));
      for (const TensorRead& r : reads) read_per_tensor[r.name] += r.end - r.begin;
      const LayerWeights cut = ShardLayerWeights(all, table, shard);
      EXPECT_EQ(w.Dense("q_proj.weight"), cut.Dense("q_proj.weight"));
      EXPECT_EQ(w.Dense("k_proj.weight"), cut.Dense("k_proj.weight"));
      EXPECT_EQ(w.Dense("v_proj.weight"), cut.Dense("v_proj.weight"));
      EXPECT_EQ(w.Dense("q_conv1d.weight"), cut.Dense("q_conv1d.weight"));
      EXPECT_EQ(w.Dense("k_conv1d.weight"), cut.Dense("k_conv1d.weight"));
      EXPECT_EQ(w.Dense("v_conv1d.weight"), cut.Dense("v_conv1d.weight"));
      EXPECT_EQ(w.Dense("f_a_proj.weight"), all.Dense("f_a_proj.weight"));
      EXPECT_EQ(w.Dense("f_b_proj.weight"), cut.Dense("f_b_proj.weight"));
      EXPECT_EQ(w.Dense("b_proj.weight"), cut.Dense("b_proj.weight"));
      EXPECT_EQ(w.Dense("g_a_proj.weight"), all.Dense("g_a_proj.weight"));
      EXPECT_EQ(w.Dense("g_b_proj.weight"), cut.Dense("g_b_proj.weight"));
      EXPECT_EQ(w.Dense("A_log"), cut.Dense("A_log"));
      EXPECT_EQ(w.Dense("dt_bias"), cut.Dense("dt_bias"));
      EXPECT_EQ(w.Dense("o_norm.weight"), all.Dense("o_norm.weight"));
      EXPECT_EQ(w.Dense("o_proj.weight"), cut.Dense("o_proj.weight"));
      // o_proj [hidden, P]: row 1 of the shard is row 1's columns of its heads.
      const std::vector<float>& w_o = w.Dense("o_proj.weight");
      const std::vector<float>& all_o = all.Dense("o_proj.weight");
      const int64_t ps = int64_t{shard.count} * full.K;
      EXPECT_TRUE(std::equal(w_o.begin() + ps, w_o.begin() + 2 * ps,
                             all_o.begin() + full.key_dim() + int64_t{shard.begin} * full.K));
      EXPECT_EQ(static_cast<int64_t>(w.Dense("A_log").size()), shard.count);
    }
    // Sharded tensors are read once over the group, replicated ones by every rank.
    const std::string pre = "model.layers.0.self_attn.";
    EXPECT_EQ(read_per_tensor[pre + "q_proj.weight"], full.key_dim() * full.hidden);
    EXPECT_EQ(read_per_tensor[pre + "o_proj.weight"], full.key_dim() * full.hidden);
    EXPECT_EQ(read_per_tensor[pre + "A_log"], full.H);
    EXPECT_EQ(read_per_tensor[pre + "f_a_proj.weight"], tp * full.K * full.hidden);
  }
}

TEST(ShardedLoading, ModelLoadRefusesHeadsThatDoNotDivide) {
  const std::string dir = testing::GoldenDir() + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(dir);
  class FakeGroup : public SingleProcessCommunicator {  // rank 0 of 3 (never communicates here)
   public:
    int size() const override { return 3; }
  };
  FakeGroup three;
  const std::string e = ErrorOf([&] { DeltaRuleModel::Load(dir, DType::kF32, std::nullopt, &three); });
  EXPECT_NE(e.find("cannot be split evenly over --tp 3"), std::string::npos) << e;
}

// ------------------------------------------------------------------ layouts

TEST(StateShards, ExtractAndPlaceRoundTripAndInterleaveConvGroups) {
  const DeltaRuleGeometry full = DeltaRuleGeometry::Kda(/*hidden=*/0, /*heads=*/4, /*head_dim=*/16, /*conv_width=*/4,
                                                        /*eps=*/1e-5);
  const int L = 2;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> rec(static_cast<size_t>(L * full.state_spec().recurrent_size()));
  std::vector<float> conv(static_cast<size_t>(L * full.state_spec().conv_size()));
  for (float& v : rec) v = u(rng);
  for (float& v : conv) v = u(rng);
  const int64_t P = int64_t{full.H} * full.K;
  for (int tp : {1, 2, 4}) {
    std::vector<float> rec_back(rec.size(), 0.0F);
    std::vector<float> conv_back(conv.size(), 0.0F);
    for (int r = 0; r < tp; ++r) {
      const HeadShard s = MakeHeadShard(full.H, r, tp);
      const std::vector<float> rs = ExtractRecurrentShard(rec.data(), L, full, s);
      const std::vector<uint8_t> cs = ExtractConvShard(conv.data(), sizeof(float), L, full, s);
      const int64_t ps = int64_t{s.count} * full.K;
      ASSERT_EQ(rs.size(), static_cast<size_t>(L * s.count * full.K * full.K));
      ASSERT_EQ(cs.size(), static_cast<size_t>(L * (full.W - 1) * 3 * ps) * sizeof(float));
      // Shard element (layer 1, row 2, group v, channel c) is full channel 2P + begin*K + c.
      float v = 0.0F;
      const int64_t row = 1 * (full.W - 1) + 2;
      std::memcpy(&v, cs.data() + static_cast<size_t>(row * 3 * ps + 2 * ps + 5) * sizeof(float), sizeof(v));
      EXPECT_EQ(v, conv[static_cast<size_t>(row * 3 * P + 2 * P + int64_t{s.begin} * full.K + 5)]);
      // Recurrent: layer 1, the shard's first head is full head `begin`.
      EXPECT_EQ(rs[static_cast<size_t>(1 * s.count * full.K * full.K)],
                rec[static_cast<size_t>((1 * full.H + s.begin) * full.K * full.K)]);
      PlaceRecurrentShard(rs.data(), rec_back.data(), L, full, s);
      PlaceConvShard(cs.data(), conv_back.data(), sizeof(float), L, full, s);
    }
    EXPECT_EQ(rec_back, rec) << "tp " << tp;
    EXPECT_EQ(conv_back, conv) << "tp " << tp;
  }
}

TEST(DataParallelSplit, BalancesTokensDeterministically) {
  const std::vector<int64_t> tokens = {100, 10, 10, 10, 50, 0, 0};
  const std::vector<int> a = AssignRequestsToDpRanks(tokens, 2);
  EXPECT_EQ(a, AssignRequestsToDpRanks(tokens, 2));
  EXPECT_EQ(a, (std::vector<int>{0, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(AssignRequestsToDpRanks(tokens, 1), std::vector<int>(tokens.size(), 0));
  // Empty requests spread over the ranks too.
  EXPECT_EQ(AssignRequestsToDpRanks({0, 0, 0, 0}, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(AssignRequestsToDpRanks({5}, 4), (std::vector<int>{0}));
  EXPECT_NE(ErrorOf([] { AssignRequestsToDpRanks({1}, 0); }).find(">= 1"), std::string::npos);
}

// ----------------------------------------------------------------- runtime

TEST(ParallelRuntime, OneProcessNeverStartsMpi) {
  if (LaunchedByMpiLauncher()) GTEST_SKIP() << "running under an MPI launcher";
  {
    const std::unique_ptr<ParallelRuntime> rt = ParallelRuntime::Start(1, 1);
    EXPECT_FALSE(rt->uses_mpi());
    EXPECT_EQ(rt->groups().world().size(), 1);
    EXPECT_EQ(rt->groups().tp().size(), 1);
    int ran = 0;
    rt->RunAgreed([&] { ++ran; });
    EXPECT_EQ(ran, 1);
    // One process: errors pass through as they are.
    EXPECT_THROW(rt->RunAgreed([] { throw PoolExhaustedError("full"); }), PoolExhaustedError);
  }
  EXPECT_FALSE(MpiRunning());
  const std::string e = ErrorOf([] { ParallelRuntime::Start(2, 1); });
  EXPECT_NE(e.find("single process"), std::string::npos) << e;
  EXPECT_NE(e.find("mpirun -np 2"), std::string::npos) << e;
  EXPECT_NE(ErrorOf([] { ParallelRuntime::Start(1, 0); }).find("--dp must be >= 1"), std::string::npos);
  EXPECT_NE(ErrorOf([] { ParallelRuntime::Start(-1, 1); }).find("--tp must be >= 1"), std::string::npos);
  EXPECT_FALSE(MpiRunning());
}

// One process through the parallel path (tp = dp = 1) serves like the plain
// scheduler: the golden case within the fp32 tolerance, results by id.
TEST(ParallelServing, OneProcessMatchesGolden) {
  const std::string dir = testing::GoldenDir() + "/kda-mini";
  const std::string path = dir + "/varlen_initstate.safetensors";
  KDA_REQUIRE_GOLDEN_PATH(path);
  const SafetensorsFile golden = SafetensorsFile::Open(path);
  SingleProcessCommunicator one;
  const ParallelGroups g(one, 1, 1);
  const DeltaRuleModel model = DeltaRuleModel::Load(dir, DType::kF32, 0, &g.tp());
  EXPECT_EQ(model.tp, nullptr);
  EXPECT_EQ(model.heads.count, model.heads.total);
  const testing::GoldenInput in = testing::ReadGoldenInput(golden, DType::kF32);
  ParallelServeOptions opt;
  opt.scheduler.prefill_chunk = 5;
  opt.scheduler.max_running = 1;
  const ParallelServeResult r = ServeParallel(model, g, testing::GoldenRequests(in, model.full_geometry(), 3), opt);
  EXPECT_EQ(r.pool_capacity, 1);
  ASSERT_EQ(r.gathered.size(), in.cu.size() - 1);
  const testing::Flat f = testing::Flatten(r.gathered, DType::kF32);
  const std::vector<float> out = ToFloatVector(golden.Get("out_fp32"));
  const std::vector<float> rec = ToFloatVector(golden.Get("final_recurrent_state"));
  const std::vector<float> conv = ToFloatVector(golden.Get("final_conv_state"));
  ASSERT_EQ(f.out.size(), out.size());
  EXPECT_TRUE(testing::AllCloseF32(f.out.data(), out.data(), out.size()));
  EXPECT_TRUE(testing::AllCloseF32(f.rec.data(), rec.data(), rec.size()));
  EXPECT_TRUE(testing::AllCloseF32(f.conv.data(), conv.data(), conv.size()));
}

}  // namespace
}  // namespace kda
