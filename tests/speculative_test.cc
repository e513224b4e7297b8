// Speculative decoding (TARGET_VERIFY with a commit of the kept positions):
// for every accepted count, the committed states (recurrent and conv tail)
// and the kept positions' outputs equal decoding the same rows one at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/radix_state_cache.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/mem_cache/recurrent_state_spec.h"
#include "kda/models/delta_rule_model.h"
#include "kda/serving/model_runner.h"
#include "kda/serving/scheduler.h"
#include "kda/serving/seeded_drafts.h"
#include "tests/error_util.h"
#include "tests/family_shapes.h"
#include "tests/request_result.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;
using testing::AllCloseStateF32;
using testing::AsFloats;
using testing::ErrorOf;
using testing::SameFinalStates;

DeltaRuleGeometry SpecShape() {
  // hidden 64: with int8 weights, input dims are multiples of 32.
  return DeltaRuleGeometry::Kda(/*hidden=*/64, /*heads=*/2, /*head_dim=*/32, /*conv_width=*/4, /*eps=*/1e-5);
}

constexpr int kLayers = 2;
constexpr int64_t kMaxDraft = 7;

// A runner over its own pool.
struct Rig {
  Rig(const DeltaRuleModel& model, int64_t slots, const VerifyConfig& verify)
      : pool(model.num_layers(), slots, model.state_spec(), model.act_dtype, verify),
        req(&pool),
        runner(model, {&pool, &req}) {}

  // Runs a batch of `ids` (each holding a slot) over `rows` [T, hidden] (as
  // fp32, stored in the model's dtype); returns the output as fp32.
  std::vector<float> Run(ForwardMode mode, const std::vector<int64_t>& ids, const std::vector<int64_t>& lens,
                         const std::vector<int64_t>& prefix, const std::vector<float>& rows) {
    ForwardBatch b;
    b.mode = mode;
    b.req_ids = ids;
    for (int64_t id : ids) b.req_pool_indices.push_back(req.SlotOf(id));
    b.extend_lens = lens;
    b.prefix_lens = prefix;
    const DType dt = runner.model().act_dtype;
    ActBuffer x(dt, static_cast<int64_t>(rows.size()));
    for (size_t i = 0; i < rows.size(); ++i) x.Set(static_cast<int64_t>(i), rows[i]);
    ActBuffer out(dt, static_cast<int64_t>(rows.size()));
    runner.Forward(b, x.view(), out.mut());
    return out.ToFloat();
  }

  // Request `id`'s states over every layer, appended as fp32.
  void AppendStates(int64_t id, std::vector<float>& rec, std::vector<float>& conv) const {
    const RecurrentStateSpec& s = pool.spec();
    std::vector<float> r(static_cast<size_t>(s.recurrent_size()));
    ActBuffer c(pool.conv_dtype(), s.conv_size());
    for (int l = 0; l < pool.num_layers(); ++l) {
      pool.GetLayerState(l, req.SlotOf(id), r.data(), c.data());
      rec.insert(rec.end(), r.begin(), r.end());
      const std::vector<float> cf = c.ToFloat();
      conv.insert(conv.end(), cf.begin(), cf.end());
    }
  }

  RecurrentStatePool pool;
  HybridReqToTokenPool req;
  ModelRunner runner;
};

// One request of the rollback test: its prompt, k drafts of which the first
// a are its true rows, and one decode step after the commit.
struct SpecRequest {
  int64_t prompt = 0;
  int64_t k = 0;
  int64_t a = 0;
  std::vector<float> rows;   // [prompt + a + 2, hidden] its true rows
  std::vector<float> wrong;  // [k - a, hidden] the rejected drafts
};

// What both runs produce, concatenated over the requests in order.
struct SpecOutputs {
  std::vector<float> kept_out;               // the outputs of the verify step's kept positions
  std::vector<float> next_out;               // the decode step after the commit
  std::vector<float> rec, conv;              // states after the kept positions
  std::vector<float> final_rec, final_conv;  // states after the next decode step
};

std::vector<SpecRequest> MakeRequests(int64_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  const auto row = [&](int64_t n) {
    std::vector<float> r(static_cast<size_t>(n * hidden));
    for (float& v : r) v = RoundBF16(normal(rng));  // bf16-exact: the same rows for both dtypes
    return r;
  };
  std::vector<SpecRequest> reqs;
  for (int64_t k = 0; k <= kMaxDraft; ++k) {
    for (int64_t a = 0; a <= k; ++a) {
      SpecRequest r;
      r.prompt = (k * 8 + a) % 7;  // 0 (a fresh request), tails shorter than the window, and longer
      r.k = k;
      r.a = a;
      r.rows = row(r.prompt + a + 2);
      r.wrong = row(k - a);
      reqs.push_back(std::move(r));
    }
  }
  return reqs;
}

// Every request decoded one row at a time (DECODE batches of one token per request).
SpecOutputs TokenByToken(const DeltaRuleModel& model, const std::vector<SpecRequest>& reqs) {
  const int64_t hidden = model.geometry.hidden;
  Rig rig(model, static_cast<int64_t>(reqs.size()), {});
  const auto n = static_cast<int64_t>(reqs.size());
  for (int64_t i = 0; i < n; ++i) rig.req.Alloc(i);
  std::vector<std::vector<float>> outs(reqs.size());
  std::vector<std::vector<float>> rec(reqs.size()), conv(reqs.size());
  int64_t steps = 0;
  for (const SpecRequest& r : reqs) steps = std::max(steps, r.prompt + r.a + 2);
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int64_t> ids, lens, prefix;
    std::vector<float> rows;
    for (int64_t i = 0; i < n; ++i) {
      const SpecRequest& r = reqs[i];
      if (s >= r.prompt + r.a + 2) continue;
      ids.push_back(i);
      lens.push_back(1);
      prefix.push_back(s);
      rows.insert(rows.end(), r.rows.begin() + s * hidden, r.rows.begin() + (s + 1) * hidden);
    }
    const std::vector<float> out = rig.Run(ForwardMode::kDecode, ids, lens, prefix, rows);
    for (size_t m = 0; m < ids.size(); ++m) {
      const SpecRequest& r = reqs[ids[m]];
      outs[ids[m]].insert(outs[ids[m]].end(), out.begin() + m * hidden, out.begin() + (m + 1) * hidden);
      if (s == r.prompt + r.a) rig.AppendStates(ids[m], rec[ids[m]], conv[ids[m]]);
    }
  }
  SpecOutputs o;
  for (int64_t i = 0; i < n; ++i) {
    const SpecRequest& r = reqs[i];
    const std::vector<float>& ro = outs[i];
    o.kept_out.insert(o.kept_out.end(), ro.begin() + r.prompt * hidden, ro.begin() + (r.prompt + r.a + 1) * hidden);
    o.next_out.insert(o.next_out.end(), ro.begin() + (r.prompt + r.a + 1) * hidden, ro.end());
    o.rec.insert(o.rec.end(), rec[i].begin(), rec[i].end());
    o.conv.insert(o.conv.end(), conv[i].begin(), conv[i].end());
    rig.AppendStates(i, o.final_rec, o.final_conv);
  }
  return o;
}

// The prompts (as one EXTEND batch, or DECODE steps), then one TARGET_VERIFY
// batch of every request (1 + k positions each, k from 0 to 7), a commit of
// a + 1 positions each, then one DECODE step.
SpecOutputs Speculative(const DeltaRuleModel& model, const std::vector<SpecRequest>& reqs, bool extend_prompt,
                        VerifyMethod method) {
  const int64_t hidden = model.geometry.hidden;
  const auto n = static_cast<int64_t>(reqs.size());
  Rig rig(model, n, {.max_draft_tokens = kMaxDraft, .method = method});
  for (int64_t i = 0; i < n; ++i) rig.req.Alloc(i);
  int64_t longest = 0;
  for (const SpecRequest& r : reqs) longest = std::max(longest, r.prompt);
  for (int64_t s = 0; s < (extend_prompt ? 1 : longest); ++s) {
    std::vector<int64_t> ids, lens, prefix;
    std::vector<float> rows;
    for (int64_t i = 0; i < n; ++i) {
      const SpecRequest& r = reqs[i];
      const int64_t len = extend_prompt ? r.prompt : (s < r.prompt ? 1 : 0);
      if (len == 0) continue;
      ids.push_back(i);
      lens.push_back(len);
      prefix.push_back(extend_prompt ? 0 : s);
      rows.insert(rows.end(), r.rows.begin() + (extend_prompt ? 0 : s) * hidden,
                  r.rows.begin() + (extend_prompt ? len : s + 1) * hidden);
    }
    rig.Run(extend_prompt ? ForwardMode::kExtend : ForwardMode::kDecode, ids, lens, prefix, rows);
  }
  std::vector<int64_t> ids, lens, prefix, keep;
  std::vector<float> rows;
  for (int64_t i = 0; i < n; ++i) {
    const SpecRequest& r = reqs[i];
    ids.push_back(i);
    lens.push_back(1 + r.k);
    prefix.push_back(r.prompt);
    keep.push_back(r.a + 1);
    rows.insert(rows.end(), r.rows.begin() + r.prompt * hidden, r.rows.begin() + (r.prompt + r.a + 1) * hidden);
    rows.insert(rows.end(), r.wrong.begin(), r.wrong.end());
  }
  const std::vector<float> verify = rig.Run(ForwardMode::kTargetVerify, ids, lens, prefix, rows);
  rig.runner.CommitVerify(ids, keep);
  SpecOutputs o;
  int64_t at = 0;
  std::vector<float> next_rows;
  for (int64_t i = 0; i < n; ++i) {
    const SpecRequest& r = reqs[i];
    o.kept_out.insert(o.kept_out.end(), verify.begin() + at * hidden, verify.begin() + (at + r.a + 1) * hidden);
    at += 1 + r.k;
    rig.AppendStates(i, o.rec, o.conv);
    prefix[i] = r.prompt + r.a + 1;
    next_rows.insert(next_rows.end(), r.rows.end() - hidden, r.rows.end());
  }
  o.next_out = rig.Run(ForwardMode::kDecode, ids, std::vector<int64_t>(ids.size(), 1), prefix, next_rows);
  for (int64_t i = 0; i < n; ++i) rig.AppendStates(i, o.final_rec, o.final_conv);
  return o;
}

struct RollbackCase {
  DType dtype;
  WeightFormat weights;
  bool extend_prompt;
  VerifyMethod method;
  const char* model_type = "kimi_linear";
};

// The case's layer with its family's variant settings: KDA, or Gated DeltaNet
// (Qwen3-Next: GVA 2, K != V; Qwen3.5: GVA 3; OLMo hybrid: no GVA, V = 2K),
// input dims multiples of 32 for int8 weights.
DeltaRuleGeometry ShapeOf(const RollbackCase& c) {
  const std::string t = c.model_type;
  if (testing::IsKdaFamily(t)) return testing::FamilyGeometry(t, SpecShape());
  if (t == "qwen3_5_text") return testing::FamilyGeometry(t, DeltaRuleGeometry::Gdn(64, 2, 6, 16, 32, 4, 1e-6));
  if (t == "olmo_hybrid") return testing::FamilyGeometry(t, DeltaRuleGeometry::Gdn(64, 2, 2, 16, 32, 4, 1e-5));
  DeltaRuleGeometry g = testing::FamilyGeometry(t, DeltaRuleGeometry::Gdn(64, 2, 4, 32, 16, 4, 1e-6));
  if (t == "qwen4_exp") g.output_gate = GateActivation::kSigmoid;  // output_gate_type "sigmoid"
  return g;
}

std::string CaseName(const ::testing::TestParamInfo<RollbackCase>& info) {
  const RollbackCase& c = info.param;
  return std::string(c.model_type) + "_" + DTypeName(c.dtype) +
         (c.weights == WeightFormat::kInt8 ? "_int8" : "_dense") + (c.extend_prompt ? "_extend" : "_decode") + "_" +
         VerifyMethodName(c.method);
}

class SpecRollbackTest : public ::testing::TestWithParam<RollbackCase> {};

// Rollback at every accepted count a for k = 0..7, all in one verify batch
// (variable k, k = 0 mixed in, fresh requests and prompts shorter than the
// conv window among them).
TEST_P(SpecRollbackTest, CommittedStatesAndKeptOutputsMatchTokenByTokenDecode) {
  const RollbackCase& c = GetParam();
  const DeltaRuleModel model =
      DeltaRuleModel::Random(c.model_type, ShapeOf(c), kLayers, c.dtype, 21, nullptr, c.weights);
  const std::vector<SpecRequest> reqs = MakeRequests(model.geometry.hidden, 5);
  const SpecOutputs got = Speculative(model, reqs, c.extend_prompt, c.method);
  const SpecOutputs want = TokenByToken(model, reqs);
  ASSERT_EQ(got.kept_out.size(), want.kept_out.size());
  ASSERT_EQ(got.rec.size(), want.rec.size());
  ASSERT_EQ(got.final_rec.size(), want.final_rec.size());
  if (c.dtype == DType::kF32) {
    EXPECT_TRUE(AllCloseF32(got.kept_out.data(), want.kept_out.data(), want.kept_out.size()));
    EXPECT_TRUE(AllCloseF32(got.next_out.data(), want.next_out.data(), want.next_out.size()));
    EXPECT_TRUE(AllCloseStateF32(got.rec.data(), want.rec.data(), want.rec.size()));
    EXPECT_TRUE(AllCloseStateF32(got.conv.data(), want.conv.data(), want.conv.size()));
    EXPECT_TRUE(AllCloseStateF32(got.final_rec.data(), want.final_rec.data(), want.final_rec.size()));
    EXPECT_TRUE(AllCloseStateF32(got.final_conv.data(), want.final_conv.data(), want.final_conv.size()));
    return;
  }
  // bf16 rule v2: r = the bf16 token-by-token decode, x = the fp32 one.
  const DeltaRuleModel exact_model =
      DeltaRuleModel::Random(c.model_type, ShapeOf(c), kLayers, DType::kF32, 21, nullptr, c.weights);
  const SpecOutputs x = TokenByToken(exact_model, reqs);
  EXPECT_TRUE(AllCloseBF16(got.kept_out.data(), want.kept_out.data(), x.kept_out.data(), x.kept_out.size()));
  EXPECT_TRUE(AllCloseBF16(got.next_out.data(), want.next_out.data(), x.next_out.data(), x.next_out.size()));
  EXPECT_TRUE(AllCloseBF16(got.rec.data(), want.rec.data(), x.rec.data(), x.rec.size()));
  EXPECT_TRUE(AllCloseBF16(got.conv.data(), want.conv.data(), x.conv.data(), x.conv.size()));
  EXPECT_TRUE(AllCloseBF16(got.final_rec.data(), want.final_rec.data(), x.final_rec.data(), x.final_rec.size()));
  EXPECT_TRUE(AllCloseBF16(got.final_conv.data(), want.final_conv.data(), x.final_conv.data(), x.final_conv.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Spec, SpecRollbackTest,
    ::testing::Values(
        RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kRecompute},
        RollbackCase{DType::kF32, WeightFormat::kDense, false, VerifyMethod::kRecompute},
        RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kTokenStates},
        RollbackCase{DType::kF32, WeightFormat::kInt8, true, VerifyMethod::kRecompute},
        RollbackCase{DType::kBF16, WeightFormat::kDense, false, VerifyMethod::kRecompute},
        RollbackCase{DType::kBF16, WeightFormat::kDense, false, VerifyMethod::kTokenStates},
        RollbackCase{DType::kBF16, WeightFormat::kInt8, false, VerifyMethod::kRecompute},
        RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kRecompute, "qwen3_next"},
        RollbackCase{DType::kF32, WeightFormat::kDense, false, VerifyMethod::kTokenStates, "qwen3_next"},
        RollbackCase{DType::kBF16, WeightFormat::kInt8, true, VerifyMethod::kRecompute, "qwen3_next"},
        RollbackCase{DType::kF32, WeightFormat::kInt8, false, VerifyMethod::kRecompute, "qwen3_5_text"},
        RollbackCase{DType::kBF16, WeightFormat::kDense, true, VerifyMethod::kTokenStates, "qwen3_5_text"},
        // The variants: the lower-bound gate (GLM-5 Next; Bailing, its gate rounded to bf16),
        // beta = 2 sigmoid(b) with V = 2K (OLMo hybrid), the fused in_proj (Lara), the sigmoid
        // output gate (Qwen4-Exp).
        RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kTokenStates, "glm5_next"},
        RollbackCase{DType::kBF16, WeightFormat::kInt8, false, VerifyMethod::kRecompute, "glm5_next"},
        RollbackCase{DType::kBF16, WeightFormat::kDense, true, VerifyMethod::kTokenStates, "bailing_hybrid"},
        RollbackCase{DType::kF32, WeightFormat::kInt8, false, VerifyMethod::kRecompute, "bailing_hybrid"},
        RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kTokenStates, "olmo_hybrid"},
        RollbackCase{DType::kBF16, WeightFormat::kInt8, false, VerifyMethod::kRecompute, "olmo_hybrid"},
        RollbackCase{DType::kF32, WeightFormat::kInt8, true, VerifyMethod::kRecompute, "lara_mini"},
        RollbackCase{DType::kBF16, WeightFormat::kDense, false, VerifyMethod::kTokenStates, "qwen4_exp"},
        // Mamba2 mixers (the SSD layer: no delta correction, D skip, the conv bias, the grouped norm).
        RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kRecompute, "granitemoehybrid"},
        RollbackCase{DType::kBF16, WeightFormat::kInt8, false, VerifyMethod::kTokenStates, "nemotron_h"},
        // Falcon-H1's multipliers and norm before the gate; Zamba2's dt clamp.
        RollbackCase{DType::kBF16, WeightFormat::kDense, true, VerifyMethod::kTokenStates, "falcon_h1"},
        RollbackCase{DType::kF32, WeightFormat::kInt8, false, VerifyMethod::kRecompute, "falcon_h1"},
        RollbackCase{DType::kF32, WeightFormat::kDense, false, VerifyMethod::kTokenStates, "zamba2"}),
    CaseName);

std::vector<float> Rows(int64_t n, int64_t hidden, float v) { return std::vector<float>(n * hidden, v); }

// A verify step leaves the committed states as they are; the slot takes no
// other batch until its commit; bad commits and batches are refused with
// nothing written.
TEST(SpecVerify, LeavesCommittedStatesAndRefusesOtherBatchesUntilItsCommit) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SpecShape(), kLayers, DType::kF32, 3);
  const int64_t hidden = model.geometry.hidden;
  Rig rig(model, 2, {.max_draft_tokens = 3});
  rig.req.Alloc(1);
  rig.req.Alloc(2);
  rig.Run(ForwardMode::kExtend, {1, 2}, {5, 2}, {0, 0}, Rows(7, hidden, 0.5F));
  std::vector<float> rec0, conv0;
  rig.AppendStates(1, rec0, conv0);
  rig.AppendStates(2, rec0, conv0);

  EXPECT_NE(ErrorOf([&] {
              rig.Run(ForwardMode::kTargetVerify, {1, 2}, {5, 1}, {5, 2}, Rows(6, hidden, 0.25F));
            }).find("1 + k per request, k in [0, 3]"),
            std::string::npos);
  rig.Run(ForwardMode::kTargetVerify, {1, 2}, {4, 1}, {5, 2}, Rows(5, hidden, 0.25F));
  std::vector<float> rec1, conv1;
  rig.AppendStates(1, rec1, conv1);
  rig.AppendStates(2, rec1, conv1);
  EXPECT_EQ(rec1, rec0);
  EXPECT_EQ(conv1, conv0);
  EXPECT_EQ(rig.pool.pending_verify(rig.req.SlotOf(1)), 4);
  EXPECT_EQ(rig.pool.pending_verify(rig.req.SlotOf(2)), 1);

  EXPECT_NE(ErrorOf([&] {
              rig.Run(ForwardMode::kDecode, {2}, {1}, {2}, Rows(1, hidden, 0.1F));
            }).find("waiting for its commit"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { rig.runner.CommitVerify({1, 2}, {5, 1}); }).find("keeps 5 positions"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { rig.runner.CommitVerify({1, 1}, {1, 1}); }).find("twice"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { rig.runner.CommitVerify({3}, {1}); }).find("holds no state slot"), std::string::npos);
  std::vector<float> rec2, conv2;
  rig.AppendStates(1, rec2, conv2);
  rig.AppendStates(2, rec2, conv2);
  EXPECT_EQ(rec2, rec0);
  EXPECT_EQ(conv2, conv0);

  // Keeping none leaves the state as committed before the verify step.
  rig.runner.CommitVerify({1, 2}, {0, 1});
  EXPECT_EQ(rig.pool.pending_verify(rig.req.SlotOf(1)), 0);
  std::vector<float> rec3, conv3;
  rig.AppendStates(1, rec3, conv3);
  EXPECT_EQ(rec3, std::vector<float>(rec0.begin(), rec0.begin() + static_cast<int64_t>(rec3.size())));
  EXPECT_NE(ErrorOf([&] { rig.runner.CommitVerify({1}, {1}); }).find("no verify step to commit"), std::string::npos);

  // A pool without a verify area refuses TARGET_VERIFY.
  Rig plain(model, 1, {});
  plain.req.Alloc(1);
  EXPECT_NE(ErrorOf([&] {
              plain.Run(ForwardMode::kTargetVerify, {1}, {1}, {0}, Rows(1, hidden, 0.25F));
            }).find("verify area"),
            std::string::npos);
  // A freed slot drops its pending positions.
  rig.Run(ForwardMode::kTargetVerify, {1}, {2}, {5}, Rows(2, hidden, 0.25F));
  rig.req.Free(1);
  rig.req.Alloc(1);
  EXPECT_EQ(rig.pool.pending_verify(rig.req.SlotOf(1)), 0);
}

TEST(SpecVerify, VerifyAreaIsCountedInTheMemoryBudget) {
  const RecurrentStateSpec kimi =
      DeltaRuleGeometry::Kda(/*hidden=*/2304, /*heads=*/32, /*head_dim=*/128, /*conv_width=*/4, /*eps=*/1e-5)
          .state_spec();
  const int64_t base = RecurrentStatePool::BytesPerRequest(20, kimi, DType::kBF16);
  const VerifyConfig r{.max_draft_tokens = 3};
  const VerifyConfig s{.max_draft_tokens = 3, .method = VerifyMethod::kTokenStates};
  // Recompute: the 4 positions' projections (4P + H bf16 each) per layer.
  EXPECT_EQ(RecurrentStatePool::BytesPerRequest(20, kimi, DType::kBF16, r) - base, 20 * 4 * (4 * 4096 + 32) * 2);
  // Token states: plus a 2 MiB state per position and layer.
  EXPECT_EQ(RecurrentStatePool::BytesPerRequest(20, kimi, DType::kBF16, s) - base,
            20 * 4 * ((4 * 4096 + 32) * 2 + 32LL * 128 * 128 * 4));
  const RecurrentStateSpec small = SpecShape().state_spec();
  const int64_t per = RecurrentStatePool::BytesPerRequest(2, small, DType::kF32, r);
  EXPECT_EQ(RecurrentStatePool::MaxRequestsForBudget(5 * per, 2, small, DType::kF32, r), 4);
  RecurrentStatePool pool(2, 4, small, DType::kF32, r);
  EXPECT_EQ(pool.total_bytes(), 5 * per);
}

// ---------------------------------------------------------------- scheduler

// A request's result against its plain run: rows [cached, length) within the
// fp32 tolerance, final states within the state rule.
::testing::AssertionResult SameResult(const RequestResult& got, const RequestResult& want, int64_t hidden) {
  if (got.out.size() != want.out.size()) return ::testing::AssertionFailure() << "output sizes differ";
  const std::vector<float> g = AsFloats(got.out);  // an empty request has no rows (and null data)
  const std::vector<float> w = AsFloats(want.out);
  const auto cached = static_cast<size_t>(got.cached_tokens * hidden);
  auto r = AllCloseF32(g.data() + cached, w.data() + cached, g.size() - cached);
  if (!r) return r << " (outputs)";
  return SameFinalStates(got, want, true);
}

struct Served {
  std::map<int64_t, RequestResult> results;
  std::vector<StepRecord> steps;
  std::vector<int64_t> finish_order;
  int64_t cache_hits = 0;
};

// Serves `reqs` through `slots` slots with a verify area of `verify` (and the
// prefix cache, when given); without a verify area the draft sources are unused.
Served Serve(const DeltaRuleModel& model, const std::vector<ServeRequest>& reqs, int64_t slots,
             const VerifyConfig& verify, RadixStateCache* cache = nullptr, SchedulerConfig cfg = {}) {
  RecurrentStatePool pool(model.num_layers(), slots, model.state_spec(), model.act_dtype, verify);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req});
  cfg.prefix_cache = cache;
  Scheduler sched(runner, cfg);
  for (const ServeRequest& r : reqs) sched.Submit(r);
  sched.RunToCompletion();
  EXPECT_EQ(pool.num_free(), slots);
  Served s;
  for (RequestResult& r : sched.TakeFinished()) {
    s.finish_order.push_back(r.id);
    s.results[r.id] = std::move(r);
  }
  s.steps = sched.steps();
  s.cache_hits = sched.cache_hit_tokens();
  return s;
}

std::vector<float> RandomRows(int64_t n, int64_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> r(static_cast<size_t>(n * hidden));
  for (float& v : r) v = normal(rng);
  return r;
}

// Verify steps hold requests without drafts (k = 0) next to ones with; a
// request whose drafts are all accepted finishes inside a verify step; no
// step mixes EXTEND and TARGET_VERIFY; results hold the kept positions only
// and equal the plain runs.
TEST(SpecScheduler, VerifyStepsMixDraftlessRequestsAndFinishInsideAVerifyStep) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SpecShape(), kLayers, DType::kF32, 8);
  const int64_t hidden = model.geometry.hidden;
  const std::vector<float> x0 = RandomRows(9, hidden, 1), x1 = RandomRows(10, hidden, 2), x2 = RandomRows(7, hidden, 3);
  std::vector<ServeRequest> reqs = {
      {.id = 0, .input = {x0.data(), DType::kF32}, .length = 9, .decode_tokens = 4},
      {.id = 1, .input = {x1.data(), DType::kF32}, .length = 10, .decode_tokens = 6},
      {.id = 2, .input = {x2.data(), DType::kF32}, .length = 7, .decode_tokens = 5},  // a 2-row prompt
  };
  const Served plain = Serve(model, reqs, 3, {});
  reqs[0].draft = SeededDraftSource(reqs[0].input, hidden, 3, 1.0, 11);  // 3 drafts, all accepted: done in one step
  reqs[2].draft = SeededDraftSource(reqs[2].input, hidden, 2, 0.5, 12);
  const Served spec = Serve(model, reqs, 3, {.max_draft_tokens = 7});
  bool seen_verify = false;
  for (const StepRecord& st : spec.steps) {
    if (st.mode == ForwardMode::kTargetVerify && !seen_verify) {
      seen_verify = true;
      EXPECT_EQ(st.batch_size, 3);                  // request 1, without drafts, with k = 0
      EXPECT_EQ(st.tokens, (1 + 3) + 1 + (1 + 2));  // 1 + k positions each
    }
    if (seen_verify) {
      EXPECT_NE(st.mode, ForwardMode::kExtend);
    }
  }
  EXPECT_TRUE(seen_verify);
  EXPECT_EQ(spec.finish_order.front(), 0);  // finished in the first verify step
  int64_t committed = 0;
  for (const StepRecord& st : spec.steps) committed += st.kept;
  EXPECT_EQ(committed, 9 + 10 + 7);
  for (const auto& [id, want] : plain.results) EXPECT_TRUE(SameResult(spec.results.at(id), want, hidden)) << id;
}

TEST(SpecScheduler, BadDraftSourcesFailTheirRequestOnly) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SpecShape(), 1, DType::kF32, 8);
  const int64_t hidden = model.geometry.hidden;
  const std::vector<float> x = RandomRows(6, hidden, 1);
  RecurrentStatePool pool(1, 2, model.state_spec(), DType::kF32, {.max_draft_tokens = 2});
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req});
  Scheduler sched(runner, {});
  ServeRequest bad{.id = 1, .input = {x.data(), DType::kF32}, .length = 6, .decode_tokens = 4};
  bad.draft.propose = [](int64_t, int64_t max_k, void*, int32_t*) { return max_k + 1; };
  ServeRequest good{.id = 2, .input = {x.data(), DType::kF32}, .length = 6, .decode_tokens = 4};
  good.draft = SeededDraftSource(good.input, hidden, 2, 0.5, 3);
  ServeRequest bad_id{.id = 4, .input = {x.data(), DType::kF32}, .length = 6, .decode_tokens = 4};
  bad_id.draft.propose = [hidden](int64_t, int64_t, void* rows, int32_t* ids) -> int64_t {
    std::memset(rows, 0, static_cast<size_t>(hidden) * sizeof(float));
    ids[0] = -7;  // below -1
    return 1;
  };
  sched.Submit(bad);
  sched.Submit(bad_id);
  sched.Submit(good);
  EXPECT_NE(ErrorOf([&] { sched.RunToCompletion(); }).find("request 1: draft source: proposed 3 drafts"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { sched.RunToCompletion(); }).find("request 4: draft source: draft 0: token id -7"),
            std::string::npos);
  sched.RunToCompletion();
  ASSERT_EQ(sched.failed().size(), 2U);
  EXPECT_EQ(sched.failed()[0].id, 1);
  EXPECT_EQ(sched.failed()[1].id, 4);
  ASSERT_EQ(sched.finished().size(), 1U);
  EXPECT_EQ(pool.num_free(), 2);
}

// A draft accepted with a token id other than the request's: the committed ids
// carry the draft's, the state follows the draft's row, and the prefix cache
// keys the request's final state by the committed ids, not by the ids it was
// submitted with.
TEST(SpecScheduler, AcceptedDraftIdsKeyThePrefixCache) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SpecShape(), kLayers, DType::kF32, 5);
  const int64_t hidden = model.geometry.hidden;
  const std::vector<float> table = RandomRows(16, hidden, 21);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> committed_ids = ids;
  committed_ids[6] = 12;  // the draft accepted at position 6
  const auto rows_of = [&](const std::vector<int32_t>& t) {
    std::vector<float> r;
    for (int32_t id : t) r.insert(r.end(), table.begin() + id * hidden, table.begin() + (id + 1) * hidden);
    return r;
  };
  const std::vector<float> x = rows_of(ids), y = rows_of(committed_ids);
  ServeRequest a{.id = 0, .input = {x.data(), DType::kF32}, .length = 9, .decode_tokens = 4, .token_ids = ids.data()};
  a.draft.propose = [&](int64_t committed, int64_t /*max_k*/, void* rows, int32_t* draft_ids) -> int64_t {
    if (committed != 5) return 0;
    std::memcpy(rows, table.data() + 12 * hidden, static_cast<size_t>(hidden) * sizeof(float));
    draft_ids[0] = 12;
    return 1;
  };
  a.draft.accept = [](int64_t, int64_t k, const void*) { return k; };
  RadixStateCache cache(model.num_layers(), model.state_spec(), DType::kF32,
                        8 * RadixStateCache::SnapshotBytes(model.num_layers(), model.state_spec(), DType::kF32));
  const Served spec = Serve(model, {a}, 2, {.max_draft_tokens = 2}, &cache);
  EXPECT_EQ(spec.results.at(0).token_ids, committed_ids);

  const ServeRequest b{
      .id = 1, .input = {y.data(), DType::kF32}, .length = 9, .decode_tokens = 4, .token_ids = committed_ids.data()};
  const Served plain_b = Serve(model, {b}, 1, {});
  EXPECT_TRUE(SameResult(spec.results.at(0), plain_b.results.at(1), hidden));
  const Served cached_b = Serve(model, {b}, 1, {}, &cache);
  EXPECT_EQ(cached_b.results.at(1).cached_tokens, 9);
  EXPECT_TRUE(SameResult(cached_b.results.at(1), plain_b.results.at(1), hidden));

  ServeRequest c = a;  // the ids the first request was submitted with, no drafts
  c.id = 2;
  c.draft = {};
  const Served plain_c = Serve(model, {c}, 1, {});
  EXPECT_EQ(plain_c.results.at(2).token_ids, ids);
  const Served cached_c = Serve(model, {c}, 1, {}, &cache);
  EXPECT_EQ(cached_c.results.at(2).cached_tokens, 5);  // the prompt's snapshot, not the drafted request's
  EXPECT_TRUE(SameResult(cached_c.results.at(2), plain_c.results.at(2), hidden));
}

// Many more requests than slots, random k (0 included) and random
// acceptance, some requests without drafts, conversations continuing earlier
// requests through the prefix cache: every request's result and final states
// equal its plain (token-by-token decode) run.
TEST(SpecScheduler, ChurnWithRandomAcceptanceAndPrefixCacheMatchesPlainRuns) {
#ifdef KDA_SANITIZED
  constexpr int kRequests = 60;  // a sample: the whole churn runs in the Release build
#else
  constexpr int kRequests = 1000;
#endif
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SpecShape(), kLayers, DType::kF32, 31);
  const int64_t hidden = model.geometry.hidden;
  constexpr int kVocab = 48;
  const std::vector<float> table = RandomRows(kVocab, hidden, 99);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> ids(kRequests);
  std::vector<std::vector<float>> rows(kRequests);
  std::vector<ServeRequest> reqs;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int32_t>& t = ids[i];
    if (i > 0 && rng() % 3 == 0) t = ids[rng() % i];  // the next turn of an earlier request
    const int64_t prompt_more = rng() % 12;
    const int64_t decode = rng() % 14;
    for (int64_t j = 0; j < prompt_more + decode; ++j) t.push_back(static_cast<int32_t>(rng() % kVocab));
    for (int32_t id : t) rows[i].insert(rows[i].end(), table.begin() + id * hidden, table.begin() + (id + 1) * hidden);
    reqs.push_back({.id = i,
                    .input = {rows[i].data(), DType::kF32},
                    .length = static_cast<int64_t>(t.size()),
                    .decode_tokens = decode,
                    .token_ids = t.empty() ? nullptr : t.data()});
  }
  const Served plain = Serve(model, reqs, 8, {});
  for (int i = 0; i < kRequests; ++i) {
    if (i % 5 == 4) continue;  // no drafts
    const double alpha = 0.3 + 0.1 * (i % 7);
    DraftSource inner = SeededDraftSource(reqs[i].input, hidden, kMaxDraft, alpha, 1000 + i);
    // A random k each step (0 included), then the seeded acceptance of those k.
    reqs[i].draft.propose = [inner, i](int64_t committed, int64_t max_k, void* out, int32_t* ids) {
      return inner.propose(committed, SeededAcceptedDrafts(5000 + i, committed, max_k, 0.7), out, ids);
    };
    reqs[i].draft.accept = inner.accept;
  }
  RadixStateCache cache(model.num_layers(), model.state_spec(), DType::kF32,
                        40 * RadixStateCache::SnapshotBytes(model.num_layers(), model.state_spec(), DType::kF32));
  SchedulerConfig cfg;
  cfg.prefill_chunk = 5;
  cfg.step_token_budget = 24;
  const Served spec = Serve(model, reqs, 8, {.max_draft_tokens = kMaxDraft}, &cache, cfg);
  ASSERT_EQ(spec.results.size(), static_cast<size_t>(kRequests));
  EXPECT_GT(spec.cache_hits, 0);
  int64_t verify_steps = 0;
  for (const StepRecord& st : spec.steps) verify_steps += st.mode == ForwardMode::kTargetVerify ? 1 : 0;
  EXPECT_GT(verify_steps, 0);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(SameResult(spec.results.at(i), plain.results.at(i), hidden)) << "request " << i;
  }
}

}  // namespace
}  // namespace kda
