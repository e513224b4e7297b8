// Tensor/data parallelism in one process: the single-process communicator,
// head shards and sharded loading (each rank reads only its slices), the
// shard <-> full state layouts, the request split, and the refusals that need
// no MPI (the multi-process runs are tests/distributed_mpi_test.cc and
// tests/distributed_cli_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
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

// More ranks than key heads: `split` ranks share one, each an equal part of its value heads; refused when
// the value heads do not split (KDA's one value head per key head) or the ranks are no multiple of the heads.
TEST(HeadShard, SplitsAKeyHeadsValueHeadsOverSeveralRanks) {
  const HeadShard s = MakeHeadShard(2, 3, 4, /*value_heads_per_key_head=*/2);
  EXPECT_EQ(s.begin, 1);
  EXPECT_EQ(s.count, 1);
  EXPECT_EQ(s.split, 2);
  EXPECT_EQ(s.part, 1);
  EXPECT_FALSE(s.whole());
  // 8 rows of value heads per key head: rows 8 + 4 to 8 + 8; a key head's own rows whole.
  EXPECT_EQ(s.Range(8, /*per_key_head=*/false), (std::pair<int64_t, int64_t>{12, 16}));
  EXPECT_EQ(s.Range(8, /*per_key_head=*/true), (std::pair<int64_t, int64_t>{8, 16}));
  const HeadShard one = MakeHeadShard(1, 2, 4, 8);
  EXPECT_EQ(one.begin, 0);
  EXPECT_EQ(one.split, 4);
  EXPECT_EQ(one.part, 2);
  struct Refused {
    int heads, size, r;
  };
  for (const Refused c : {Refused{1, 3, 8}, Refused{4, 8, 1}, Refused{2, 3, 4}}) {
    const std::string e = ErrorOf([&] { MakeHeadShard(c.heads, 0, c.size, c.r); });
    EXPECT_NE(e.find("cannot be split evenly over --tp " + std::to_string(c.size)), std::string::npos) << e;
  }
  const DeltaRuleGeometry full = DeltaRuleGeometry::Mamba2(/*hidden=*/64, /*heads=*/8, /*head_dim=*/16, /*state=*/16,
                                                           /*groups=*/1, /*conv_width=*/4, /*eps=*/1e-5);
  const DeltaRuleGeometry quarter = full.Shard(0, 1, 4);
  EXPECT_EQ(quarter.H, 1);
  EXPECT_EQ(quarter.HV, 2);
  EXPECT_EQ(quarter.head_split, 4);
  EXPECT_NE(ErrorOf([&] { full.Shard(0, 1, 3); }).find("cannot be split over 3"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { quarter.Shard(0, 1, 2); }).find("cannot be split"), std::string::npos);
}

// A Mamba2 mixer of one group over 2 and 4 ranks: each reads its heads' rows of z, x, dt, A_log, D, the
// norm and out_proj's columns, B and C whole; the values are those ShardLayerWeights cuts.
TEST(ShardedLoading, OneGroupsHeadsSplitOverRanks) {
  const std::string dir = testing::GoldenSetDir("mamba2-mini");
  KDA_REQUIRE_GOLDEN_PATH(dir);
  const ModelConfig config = LoadModelConfig(dir);
  const LayerFamily& family = LayerFamilyFor(config.model_type);
  const DeltaRuleGeometry full = family.geometry(config);
  ASSERT_EQ(full.H, 1);
  const TensorTable table = family.tensors(full);
  const Checkpoint ckpt = Checkpoint::Open(dir);
  const int layer = config.linear_layers.front();
  const std::string prefix = LayerKeyPrefix(ckpt, family, layer);
  const LayerWeights all = LoadLayerWeights(ckpt, prefix, table, MakeHeadShard(1, 0, 1));
  const int64_t inner = full.value_dim();
  const int64_t n = full.K;
  for (int tp : {2, 4}) {
    std::vector<float> z_rows;
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const HeadShard shard = MakeHeadShard(1, rank, tp, full.group());
      std::vector<TensorRead> reads;
      const LayerWeights w = LoadLayerWeights(ckpt, prefix, table, shard, &reads);
      const LayerWeights cut = ShardLayerWeights(all, table, shard);
      for (const TensorSpec& t : table) EXPECT_EQ(w.Dense(t.name), cut.Dense(t.name)) << t.name;
      const DeltaRuleGeometry g = full.Shard(0, 1, tp);
      const TensorTable local = family.tensors(g);
      for (const TensorSpec& t : local) EXPECT_EQ(static_cast<int64_t>(w.Dense(t.name).size()), t.numel()) << t.name;
      // in_proj: z | x | B | C | dt of this rank; its B rows the full B's.
      const std::vector<float>& in = w.Dense("in_proj.weight");
      const std::vector<float>& in_all = all.Dense("in_proj.weight");
      const int64_t h = full.hidden;
      const int64_t zi = inner / tp;
      z_rows.insert(z_rows.end(), in.begin(), in.begin() + zi * h);
      EXPECT_TRUE(
          std::equal(in.begin() + 2 * zi * h, in.begin() + (2 * zi + 2 * n) * h, in_all.begin() + 2 * inner * h));
      EXPECT_TRUE(std::equal(in.begin() + (2 * zi + 2 * n) * h, in.end(),
                             in_all.begin() + (2 * inner + 2 * n + rank * full.HV / tp) * h));
      EXPECT_EQ(w.Dense("D"), std::vector<float>(all.Dense("D").begin() + rank * full.HV / tp,
                                                 all.Dense("D").begin() + (rank + 1) * full.HV / tp));
    }
    EXPECT_EQ(z_rows, std::vector<float>(all.Dense("in_proj.weight").begin(),
                                         all.Dense("in_proj.weight").begin() + inner * full.hidden));
  }
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

// Random full states of L = 2 layers of `full` cut into each rank's shard and placed back, for each tp size;
// `check(shard, recurrent part, conv part, full recurrent, full conv)` looks at each rank's parts.
void ExpectShardsRoundTrip(
    const DeltaRuleGeometry& full, std::initializer_list<int> tps,
    const std::function<void(const HeadShard&, const std::vector<float>&, const std::vector<uint8_t>&,
                             const std::vector<float>&, const std::vector<float>&)>& check) {
  const int L = 2;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> rec(static_cast<size_t>(L * full.state_spec().recurrent_size()));
  std::vector<float> conv(static_cast<size_t>(L * full.state_spec().conv_size()));
  for (float& v : rec) v = u(rng);
  for (float& v : conv) v = u(rng);
  for (int tp : tps) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    std::vector<float> rec_back(rec.size(), 0.0F);
    std::vector<float> conv_back(conv.size(), 0.0F);
    for (int r = 0; r < tp; ++r) {
      const HeadShard s = MakeHeadShard(full.H, r, tp, full.group());
      const std::vector<float> rs = ExtractRecurrentShard(rec.data(), L, full, s);
      const std::vector<uint8_t> cs = ExtractConvShard(conv.data(), sizeof(float), L, full, s);
      check(s, rs, cs, rec, conv);
      PlaceRecurrentShard(rs.data(), rec_back.data(), L, full, s);
      PlaceConvShard(cs.data(), conv_back.data(), sizeof(float), L, full, s);
    }
    EXPECT_EQ(rec_back, rec);
    EXPECT_EQ(conv_back, conv);
  }
}

// The conv element of `bytes` (floats) at index i.
float ConvAt(const std::vector<uint8_t>& bytes, int64_t i) {
  float v = 0.0F;
  std::memcpy(&v, bytes.data() + static_cast<size_t>(i) * sizeof(float), sizeof(v));
  return v;
}

TEST(StateShards, ExtractAndPlaceRoundTripAndInterleaveConvGroups) {
  const DeltaRuleGeometry full = DeltaRuleGeometry::Kda(/*hidden=*/0, /*heads=*/4, /*head_dim=*/16, /*conv_width=*/4,
                                                        /*eps=*/1e-5);
  const int L = 2;
  const int64_t P = int64_t{full.H} * full.K;
  ExpectShardsRoundTrip(full, {1, 2, 4},
                        [&](const HeadShard& s, const auto& rs, const auto& cs, const auto& rec, const auto& conv) {
                          const int64_t ps = int64_t{s.count} * full.K;
                          ASSERT_EQ(rs.size(), static_cast<size_t>(L * s.count * full.K * full.K));
                          ASSERT_EQ(cs.size(), static_cast<size_t>(L * (full.W - 1) * 3 * ps) * sizeof(float));
                          // Shard element (layer 1, row 2, group v, channel c) is full channel 2P + begin*K + c.
                          const int64_t row = 1 * (full.W - 1) + 2;
                          EXPECT_EQ(ConvAt(cs, row * 3 * ps + 2 * ps + 5),
                                    conv[static_cast<size_t>(row * 3 * P + 2 * P + s.begin * full.K + 5)]);
                          // Recurrent: layer 1, the shard's first head is full head `begin`.
                          EXPECT_EQ(rs[static_cast<size_t>(1 * s.count * full.K * full.K)],
                                    rec[static_cast<size_t>((1 * full.H + s.begin) * full.K * full.K)]);
                        });
}

// A Mamba2 mixer of one group over 2 and 4 ranks: each rank's states are its heads' [r / split, P, N] blocks
// and the x channels of the conv tail with B and C whole; placing every rank's gives the full states back.
TEST(StateShards, OneGroupsHeadsSplitOverRanksRoundTrip) {
  const DeltaRuleGeometry full = DeltaRuleGeometry::Mamba2(/*hidden=*/0, /*heads=*/8, /*head_dim=*/8, /*state=*/4,
                                                           /*groups=*/1, /*conv_width=*/4, /*eps=*/1e-5);
  const int L = 2;
  const int64_t C = full.conv_channels();
  const int64_t head = int64_t{full.V} * full.K;  // one head's state
  ExpectShardsRoundTrip(
      full, {2, 4}, [&](const HeadShard& s, const auto& rs, const auto& cs, const auto& rec, const auto& conv) {
        const int tp = s.split;
        const int r = s.part;
        const int64_t heads = full.HV / tp;
        const int64_t xs = heads * full.V;  // the shard's x channels, then B and C
        const int64_t cs_row = xs + 2 * full.K;
        ASSERT_EQ(rs.size(), static_cast<size_t>(L * heads * head));
        ASSERT_EQ(cs.size(), static_cast<size_t>(L * (full.W - 1) * cs_row) * sizeof(float));
        // Layer 1: the shard's first head is full head r * heads.
        EXPECT_EQ(rs[static_cast<size_t>(heads * head)], rec[static_cast<size_t>((full.HV + r * heads) * head)]);
        // Conv row 4 (layer 1's second): x channel 3 and B's channel 1.
        const int64_t row = 1 * (full.W - 1) + 1;
        EXPECT_EQ(ConvAt(cs, row * cs_row + 3), conv[static_cast<size_t>(row * C + r * xs + 3)]);
        EXPECT_EQ(ConvAt(cs, row * cs_row + xs + 1), conv[static_cast<size_t>(row * C + full.value_dim() + 1)]);
      });
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
