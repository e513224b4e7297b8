// Tensor and data parallelism under mpirun (2 or 4 ranks): the MPI
// communicator's collectives and sub-groups, agreed errors, sharded loading,
// and the golden cases served over every tp x dp layout that fits the world
// (one-shot and chunked prefill + decode, fp32 and bf16), against the
// expected outputs within the design §5 tolerances.
//
// Every rank runs every test. Collectives never sit behind an assertion;
// results are compared on rank 0 after the last collective.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/error.h"
#include "kda/distributed/parallel_groups.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/kernels/gemm_route.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "kda/serving/parallel.h"
#include "kda/serving/seeded_drafts.h"
#include "tests/distributed_mpi_world.h"
#include "tests/distributed_util.h"
#include "tests/error_util.h"
#include "tests/golden.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::MpiWorld;

using testing::ErrorOf;

// ------------------------------------------------------------ communicator

TEST(MpiCommunicator, AllReduceSumsFp32AndBf16) {
  Communicator& w = MpiWorld();
  const int n = w.size();
  const int r = w.rank();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5F * static_cast<float>(r + 1) + static_cast<float>(i);
  w.AllReduceSum(v.data(), static_cast<int64_t>(v.size()));
  int bad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    bad += v[i] == 0.25F * static_cast<float>(n * (n + 1)) + static_cast<float>(n * i) ? 0 : 1;
  }
  EXPECT_EQ(bad, 0);
  // bf16: summed in fp32, rounded once (3.0 + 1/256 per rank is not a bf16 sum).
  std::vector<BF16> b(64);
  for (size_t i = 0; i < b.size(); ++i) b[i] = ToBF16(static_cast<float>(r + 1) + 0.25F * static_cast<float>(i));
  w.AllReduceSumBF16(b.data(), static_cast<int64_t>(b.size()));
  for (size_t i = 0; i < b.size(); ++i) {
    float want = 0.0F;
    for (int q = 0; q < n; ++q) want += ToFloat(ToBF16(static_cast<float>(q + 1) + 0.25F * static_cast<float>(i)));
    EXPECT_EQ(b[i].bits, ToBF16(want).bits) << i;
  }
}

TEST(MpiCommunicator, GathersVariableSizesBroadcastsAndSplits) {
  Communicator& w = MpiWorld();
  const int n = w.size();
  const int r = w.rank();
  const std::vector<uint8_t> mine(static_cast<size_t>(r + 1), static_cast<uint8_t>(10 + r));
  for (int root : {0, n - 1}) {
    const std::vector<std::vector<uint8_t>> all = w.Gather(mine.data(), static_cast<int64_t>(mine.size()), root);
    if (r != root) {
      EXPECT_TRUE(all.empty());
      continue;
    }
    EXPECT_EQ(all.size(), static_cast<size_t>(n));
    for (int q = 0; q < n && q < static_cast<int>(all.size()); ++q) {
      EXPECT_EQ(all[q], std::vector<uint8_t>(static_cast<size_t>(q + 1), static_cast<uint8_t>(10 + q)));
    }
  }
  int64_t value = r == n - 1 ? 4242 : -1;
  w.Broadcast(&value, sizeof(value), n - 1);
  EXPECT_EQ(value, 4242);
  w.Barrier();
  // Odd and even ranks: two groups ranked by descending world rank.
  const std::unique_ptr<Communicator> half = w.Split(r % 2, -r);
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  EXPECT_EQ(half->rank(), (half->size() - 1) - r / 2);
  float s = static_cast<float>(r);
  half->AllReduceSum(&s, 1);
  float want = 0.0F;
  for (int q = r % 2; q < n; q += 2) want += static_cast<float>(q);
  EXPECT_EQ(s, want);
}

TEST(ParallelGroups, SplitTheWorldIntoTpAndDpGroups) {
  Communicator& w = MpiWorld();
  const int n = w.size();
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    const int dp = n / tp;
    SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp));
    const ParallelGroups g(w, tp, dp);
    EXPECT_EQ(g.tp().size(), tp);
    EXPECT_EQ(g.dp().size(), dp);
    EXPECT_EQ(g.tp().rank(), g.tp_rank());
    EXPECT_EQ(g.dp().rank(), g.dp_rank());
    EXPECT_EQ(g.dp_rank() * tp + g.tp_rank(), w.rank());
    // The world ranks of my tp group are consecutive; my dp group's are tp apart.
    float tp_sum = static_cast<float>(w.rank());
    float dp_sum = static_cast<float>(w.rank());
    g.tp().AllReduceSum(&tp_sum, 1);
    g.dp().AllReduceSum(&dp_sum, 1);
    const int want_tp = g.dp_rank() * tp * tp + tp * (tp - 1) / 2;
    const int want_dp = tp * dp * (dp - 1) / 2 + dp * g.tp_rank();
    EXPECT_EQ(tp_sum, static_cast<float>(want_tp));
    EXPECT_EQ(dp_sum, static_cast<float>(want_dp));
  }
  // A layout that does not fill the world: refused on every rank, no collective.
  EXPECT_NE(ErrorOf([&] { ParallelGroups g(w, n + 1, 1); }).find("processes"), std::string::npos);
}

TEST(ParallelRuntime, RefusesAWrongWorldSizeAndAgreesOnErrors) {
  Communicator& w = MpiWorld();
  const int n = w.size();
  EXPECT_NE(ErrorOf([&] { ParallelRuntime::Start(n + 1, 1); }).find("mpirun started " + std::to_string(n)),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ParallelRuntime::Start(1, 2 * n); }).find("mpirun -np " + std::to_string(2 * n)),
            std::string::npos);
  std::unique_ptr<ParallelRuntime> rt = ParallelRuntime::Start(n, 1);  // MPI already runs: left running
  ASSERT_TRUE(rt->uses_mpi());
  // One rank fails: every rank throws its message.
  std::string one;
  std::string own;
  bool failed_here = false;
  try {
    rt->RunAgreed([&] {
      if (w.rank() == n - 1) throw Error("input missing on the last host");
    });
  } catch (const CollectiveError& e) {
    one = e.what();
    own = e.own_message();
    failed_here = e.failed_here();
  }
  EXPECT_EQ(one, "input missing on the last host (on rank " + std::to_string(n - 1) + ")");
  // Only the failing rank knows it failed (and it alone reports, in the CLI).
  EXPECT_EQ(failed_here, w.rank() == n - 1);
  EXPECT_EQ(own, w.rank() == n - 1 ? "input missing on the last host" : "");
  // Every rank fails alike: the message as it is.
  std::string all;
  try {
    rt->RunAgreed([&] { throw Error("bad flag"); });
  } catch (const CollectiveError& e) {
    all = e.what();
  }
  EXPECT_EQ(all, "bad flag");
  int ran = 0;
  rt->RunAgreed([&] { ++ran; });
  EXPECT_EQ(ran, 1);
  rt.reset();
  w.Barrier();  // MPI still runs
}

// ------------------------------------------------------------------ golden

struct Layout {
  int tp;
  int dp;
};

// Every tp x dp = world size with tp dividing the 4 golden heads.
std::vector<Layout> Layouts(int world) {
  std::vector<Layout> v;
  for (int tp : {1, 2, 4}) {
    if (world % tp == 0) v.push_back({tp, world / tp});
  }
  return v;
}

std::string Name(const Layout& l) { return "tp " + std::to_string(l.tp) + " x dp " + std::to_string(l.dp); }

TEST(ParallelRuntime, AgreesOnWorldRankZerosGemmPlan) {
  Communicator& w = MpiWorld();
  const auto everywhere = [&](GemmRoute route) {
    std::vector<float> n{CpuSupportsGemmRoute(route) ? 1.0F : 0.0F};
    w.AllReduceSum(n.data(), 1);
    return n[0] == static_cast<float>(w.size());
  };
  const bool dot_everywhere = everywhere(GemmRoute::kBf16Dot);
  const bool tiles_everywhere = everywhere(GemmRoute::kAmx);
  // Rank 0 forces fp32_fma and the others take their start-up choice: every
  // rank ends on fp32_fma.
  SetGemmRoute(w.rank() == 0 ? GemmRoute::kF32Fma : GemmRoute::kAuto);
  const GemmPlan fma = AgreeGemmPlan(w);
  const GemmPlan fma_active = ActiveGemmPlan();
  // Then rank 0 a route per class, each taken where every rank runs it.
  const GemmPlan want{GemmRoute::kBf16Dot, GemmRoute::kAmx, GemmRoute::kF32Fma};
  GemmPlan here = want;
  if (!CpuSupportsGemmRoute(GemmRoute::kAmx)) here.batch = GemmRoute::kAuto;
  if (!CpuSupportsGemmRoute(GemmRoute::kBf16Dot)) here.decode = here.batch = GemmRoute::kAuto;
  SetGemmPlan(w.rank() == 0 ? here : GemmPlan{});
  const GemmPlan mixed = AgreeGemmPlan(w);
  const GemmPlan mixed_active = ActiveGemmPlan();
  SetGemmRoute(GemmRoute::kAuto);
  EXPECT_EQ(fma, GemmPlan::All(GemmRoute::kF32Fma));
  EXPECT_EQ(fma_active, fma);
  EXPECT_EQ(mixed.prefill, GemmRoute::kF32Fma);
  if (dot_everywhere && tiles_everywhere) {
    EXPECT_EQ(mixed, want);
  }
  if (!dot_everywhere) {
    EXPECT_NE(mixed.decode, GemmRoute::kBf16Dot);
  }
  if (!tiles_everywhere) {
    EXPECT_NE(mixed.batch, GemmRoute::kAmx);
  }
  EXPECT_EQ(mixed_active, mixed);
}

TEST(DistributedLoading, EachRankReadsOnlyItsHeadsAndHoldsOnlyTheirStates) {
  const std::string dir = testing::GoldenDir() + "/kda-mini";
  KDA_REQUIRE_GOLDEN_PATH(dir);
  Communicator& w = MpiWorld();
  const ModelConfig config = LoadModelConfig(dir);
  const DeltaRuleGeometry full = testing::KdaGeometry(config);
  const Checkpoint ckpt = Checkpoint::Open(dir);
  const LayerWeights all = testing::LoadKdaLayer(ckpt, config, 0);
  for (const Layout& l : Layouts(w.size())) {
    SCOPED_TRACE(Name(l));
    const ParallelGroups g(w, l.tp, l.dp);
    const HeadShard shard = MakeHeadShard(full.H, g.tp_rank(), l.tp);
    std::vector<TensorRead> reads;
    const LayerWeights mine = testing::LoadKdaLayer(ckpt, config, 0, shard, &reads);
    EXPECT_EQ(testing::ByTensor(reads), testing::ExpectedShardReads(0, full, shard));
    const LayerWeights cut = ShardLayerWeights(all, LayerFamilyFor("kimi_linear").tensors(full), shard);
    EXPECT_EQ(mine.Dense("q_proj.weight"), cut.Dense("q_proj.weight"));
    EXPECT_EQ(mine.Dense("o_proj.weight"), cut.Dense("o_proj.weight"));
    EXPECT_EQ(mine.Dense("A_log"), cut.Dense("A_log"));
    EXPECT_EQ(mine.Dense("v_conv1d.weight"), cut.Dense("v_conv1d.weight"));

    const DeltaRuleModel model = DeltaRuleModel::Load(dir, DType::kBF16, std::nullopt, &g.tp());
    EXPECT_EQ(model.geometry.H, full.H / l.tp);
    EXPECT_EQ(model.heads.begin, shard.begin);
    const int L = model.num_layers();
    const RecurrentStatePool pool(L, 3, model.state_spec(), model.act_dtype);
    const RecurrentStatePool whole(L, 3, model.full_geometry().state_spec(), model.act_dtype);
    EXPECT_EQ(pool.total_bytes() * l.tp, whole.total_bytes());
    // Every head is held by exactly one rank of each tp group.
    const int32_t mine_heads[2] = {shard.begin, shard.count};
    const std::vector<std::vector<uint8_t>> got = w.Gather(mine_heads, sizeof(mine_heads), 0);
    if (w.rank() == 0) {
      std::vector<int> owners(static_cast<size_t>(full.H), 0);
      for (const std::vector<uint8_t>& b : got) {
        int32_t h[2];
        std::memcpy(h, b.data(), sizeof(h));
        for (int i = h[0]; i < h[0] + h[1]; ++i) ++owners[i];
      }
      for (int o : owners) EXPECT_EQ(o, l.dp);
    }
  }
}

struct GoldenCase {
  const char* model;
  const char* file;
};

// Initial states, varlen and stress gates, and one sequence (so with dp > 1
// some ranks serve nothing).
// Gated DeltaNet: a value head shards with its key head (gdn-mini: 4 key, 8 value heads).
constexpr GoldenCase kCases[] = {{"kda-mini", "varlen_initstate"},
                                 {"kda-stress", "stress_varlen_initstate"},
                                 {"kda-mini", "single_T128"},
                                 {"gdn-mini", "varlen_initstate"},
                                 {"gdn-mini", "single_T128"}};

TEST(DistributedServing, GoldenCasesMatchOnEveryLayout) {
  Communicator& w = MpiWorld();
  const bool root = w.rank() == 0;
  for (const GoldenCase& c : kCases) {
    const std::string dir = testing::GoldenDir() + "/" + c.model;
    const std::string path = dir + "/" + c.file + ".safetensors";
    KDA_REQUIRE_GOLDEN_PATH(path);
    const SafetensorsFile golden = SafetensorsFile::Open(path);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const bool f32 = dt == DType::kF32;
      const testing::GoldenInput in = testing::ReadGoldenInput(golden, dt);
      const std::vector<float> want_out = ToFloatVector(golden.Get(f32 ? "out_fp32" : "out_bf16"));
      const std::vector<float> want_rec =
          ToFloatVector(golden.Get(f32 ? "final_recurrent_state" : "final_recurrent_state_bf16"));
      const std::vector<float> want_conv = ToFloatVector(golden.Get("final_conv_state"));
      const std::vector<float> exact_out = ToFloatVector(golden.Get("out_fp32"));
      const std::vector<float> exact_rec = ToFloatVector(golden.Get("final_recurrent_state"));
      // One-shot, then served: prefill chunks of 7, the last 9 tokens as
      // DECODE steps, at most 2 sequences holding a slot per rank.
      for (const bool served : {false, true}) {
        ParallelServeOptions opt;
        opt.kernel = KernelImpl::kReference;
        opt.scheduler.step_token_budget = 1 << 20;
        if (served) {
          opt.scheduler.prefill_chunk = 7;
          opt.scheduler.max_running = 2;
        }
        // The same flags in one process: the reference for the bf16 conv tail.
        testing::Flat single;
        if (root) {
          SingleProcessCommunicator one;
          const ParallelGroups solo(one, 1, 1);
          const DeltaRuleModel m = DeltaRuleModel::Load(dir, dt, 0);
          single = testing::Flatten(
              ServeParallel(m, solo, testing::GoldenRequests(in, m.full_geometry(), served ? 9 : 0), opt).gathered, dt);
        }
        for (const Layout& l : Layouts(w.size())) {
          const std::string what = std::string(c.model) + "/" + c.file + (f32 ? " fp32 " : " bf16 ") +
                                   (served ? "served " : "one-shot ") + Name(l);
          SCOPED_TRACE(what);
          const ParallelGroups g(w, l.tp, l.dp);
          const DeltaRuleModel model = DeltaRuleModel::Load(dir, dt, 0, &g.tp());
          const ParallelServeResult r =
              ServeParallel(model, g, testing::GoldenRequests(in, model.full_geometry(), served ? 9 : 0), opt);
          if (!root) {
            EXPECT_TRUE(r.gathered.empty());
            continue;
          }
          // No ASSERT here: the other ranks go on to the next layout's collectives.
          EXPECT_EQ(r.gathered.size(), in.cu.size() - 1);
          for (size_t i = 0; i < r.gathered.size(); ++i) EXPECT_EQ(r.gathered[i].id, static_cast<int64_t>(i));
          const testing::Flat got = testing::Flatten(r.gathered, dt);
          if (got.out.size() != want_out.size() || got.rec.size() != want_rec.size() ||
              got.conv.size() != want_conv.size() || got.conv.size() != single.conv.size()) {
            ADD_FAILURE() << "result sizes differ from the golden case";
            continue;
          }
          if (f32) {
            EXPECT_TRUE(testing::AllCloseF32(got.out.data(), want_out.data(), got.out.size()));
            EXPECT_TRUE(testing::AllCloseF32(got.rec.data(), want_rec.data(), got.rec.size()));
            EXPECT_TRUE(testing::AllCloseF32(got.conv.data(), want_conv.data(), got.conv.size()));
          } else {
            EXPECT_TRUE(testing::AllCloseBF16(got.out.data(), want_out.data(), exact_out.data(), got.out.size()));
            EXPECT_TRUE(testing::AllCloseBF16(got.rec.data(), want_rec.data(), exact_rec.data(), got.rec.size()));
            EXPECT_TRUE(testing::AllCloseBF16(got.conv.data(), single.conv.data(), want_conv.data(), got.conv.size()));
          }
        }
      }
    }
  }
}

// Speculative decoding on every layout: requests with seeded drafts (k from 1
// to 7, alpha from 0.5 to 0.9; the same draws on every rank) served with a
// verify area against the plain runs in one process (fp32; bf16 rule v2 with
// r = the plain bf16 run and x = the plain fp32 run; dense and int8 weights).
// Every accepted count 0..7 occurs on every layout.
TEST(DistributedServing, SpeculativeMatchesPlainDecodeOnEveryLayout) {
  Communicator& w = MpiWorld();
  const bool root = w.rank() == 0;
  const DeltaRuleGeometry shape = DeltaRuleGeometry::Kda(/*hidden=*/64, /*heads=*/4, /*head_dim=*/32, /*conv_width=*/4,
                                                         /*eps=*/1e-5);
  struct Variant {
    DType dt;
    WeightFormat weights;
  };
#ifdef KDA_SANITIZED
  const std::vector<Variant> variants = {{DType::kBF16, WeightFormat::kInt8}};  // a sample; all in the Release run
#else
  const std::vector<Variant> variants = {
      {DType::kF32, WeightFormat::kDense}, {DType::kBF16, WeightFormat::kDense}, {DType::kBF16, WeightFormat::kInt8}};
#endif
  constexpr int kRequests = 5;
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<std::vector<float>> rows(kRequests);
  std::vector<int64_t> lens, decodes;
  const int64_t draft_k[kRequests] = {1, 3, 7, 7, 5};
  const double alpha[kRequests] = {0.5, 0.7, 0.85, 0.75, 0.6};
  for (int i = 0; i < kRequests; ++i) {
    lens.push_back(8 + i * 3 + (draft_k[i] == 7 ? 60 : 0));
    decodes.push_back(6 + i + (draft_k[i] == 7 ? 60 : 0));
    for (int64_t j = 0; j < lens.back() * shape.hidden; ++j) rows[i].push_back(RoundBF16(normal(rng)));
  }
  for (const Variant& v : variants) {
    const bool f32 = v.dt == DType::kF32;
    std::vector<ActBuffer> inputs;
    std::vector<ServeRequest> plain, spec;
    for (int i = 0; i < kRequests; ++i) {
      inputs.emplace_back(v.dt, lens[i] * shape.hidden);
      for (size_t j = 0; j < rows[i].size(); ++j) inputs.back().Set(static_cast<int64_t>(j), rows[i][j]);
    }
    for (int i = 0; i < kRequests; ++i) {
      plain.push_back({.id = i, .input = inputs[i].view(), .length = lens[i], .decode_tokens = decodes[i]});
      spec.push_back(plain.back());
      spec.back().draft = SeededDraftSource(inputs[i].view(), shape.hidden, draft_k[i], alpha[i], 40 + i);
    }
    ParallelServeOptions opt;
    opt.scheduler.max_running = 2;
    testing::Flat want, exact;
    if (root) {
      SingleProcessCommunicator one;
      const ParallelGroups solo(one, 1, 1);
      const DeltaRuleModel m = DeltaRuleModel::Random("kimi_linear", shape, 2, v.dt, 17, nullptr, v.weights);
      want = testing::Flatten(ServeParallel(m, solo, plain, opt).gathered, v.dt);
      if (!f32) {
        const DeltaRuleModel mx = DeltaRuleModel::Random("kimi_linear", shape, 2, DType::kF32, 17, nullptr, v.weights);
        std::vector<ActBuffer> xin;
        std::vector<ServeRequest> xreqs = plain;
        for (int i = 0; i < kRequests; ++i) {
          xin.emplace_back(DType::kF32, lens[i] * shape.hidden);
          for (size_t j = 0; j < rows[i].size(); ++j) xin.back().Set(static_cast<int64_t>(j), rows[i][j]);
        }
        for (int i = 0; i < kRequests; ++i) xreqs[i].input = xin[i].view();
        exact = testing::Flatten(ServeParallel(mx, solo, xreqs, opt).gathered, DType::kF32);
      }
    }
    opt.verify.max_draft_tokens = 7;
    for (const Layout& l : Layouts(w.size())) {
      std::vector<bool> accepted(8, false);  // the accepted counts this rank's k = 7 requests saw
      std::vector<ServeRequest> seen = spec;
      for (int i = 0; i < kRequests; ++i) {
        if (draft_k[i] != 7) continue;
        seen[i].draft.accept = [inner = spec[i].draft.accept, &accepted](int64_t committed, int64_t k,
                                                                         const void* out) {
          const int64_t a = inner(committed, k, out);
          if (k == 7) accepted[static_cast<size_t>(a)] = true;
          return a;
        };
      }
      SCOPED_TRACE(std::string(f32 ? "fp32 " : "bf16 ") + (v.weights == WeightFormat::kInt8 ? "int8 " : "dense ") +
                   Name(l));
      const ParallelGroups g(w, l.tp, l.dp);
      const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", shape, 2, v.dt, 17, &g.tp(), v.weights);
      const ParallelServeResult r = ServeParallel(model, g, seen, opt);
      if (l.dp == 1) {  // with dp > 1 a rank serves only some of the requests
        for (size_t a = 0; a < accepted.size(); ++a) EXPECT_TRUE(accepted[a]) << "accepted count " << a;
      }
      if (!root) continue;
      const testing::Flat got = testing::Flatten(r.gathered, v.dt);
      if (got.out.size() != want.out.size() || got.rec.size() != want.rec.size() ||
          got.conv.size() != want.conv.size()) {
        ADD_FAILURE() << "result sizes differ from the plain run";
        continue;
      }
      int64_t verify_steps = 0;
      for (const StepRecord& st : r.steps) verify_steps += st.mode == ForwardMode::kTargetVerify ? 1 : 0;
      EXPECT_GT(verify_steps, 0);
      if (f32) {
        EXPECT_TRUE(testing::AllCloseF32(got.out.data(), want.out.data(), got.out.size()));
        EXPECT_TRUE(testing::AllCloseStateF32(got.rec.data(), want.rec.data(), got.rec.size()));
        EXPECT_TRUE(testing::AllCloseStateF32(got.conv.data(), want.conv.data(), got.conv.size()));
      } else {
        EXPECT_TRUE(testing::AllCloseBF16(got.out.data(), want.out.data(), exact.out.data(), got.out.size()));
        EXPECT_TRUE(testing::AllCloseBF16(got.rec.data(), want.rec.data(), exact.rec.data(), got.rec.size()));
        EXPECT_TRUE(testing::AllCloseBF16(got.conv.data(), want.conv.data(), exact.conv.data(), got.conv.size()));
      }
    }
  }
}

}  // namespace
}  // namespace kda
