// Speculative decoding (TARGET_VERIFY with a commit of the kept positions):
// for every accepted count, the committed states (recurrent and conv tail)
// and the kept positions' outputs equal decoding the same rows one at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/serving/model_runner.h"
#include "tests/error_util.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;
using testing::AllCloseStateF32;
using testing::ErrorOf;

KdaLayerShape SpecShape() {
  KdaLayerShape s;
  s.hidden = 64;  // int8 weights: input dims are multiples of 32
  s.H = 2;
  s.K = 32;
  s.W = 4;
  return s;
}

constexpr int kLayers = 2;
constexpr int64_t kMaxDraft = 7;

// A runner over its own pool.
struct Rig {
  Rig(const KdaModel& model, int64_t slots, const VerifyConfig& verify)
      : pool(model.num_layers(), slots, model.shape, model.act_dtype, verify),
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
    const KdaLayerShape& s = pool.shape();
    std::vector<float> r(static_cast<size_t>(s.RecurrentStateSize()));
    ActBuffer c(pool.conv_dtype(), s.ConvStateSize());
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
SpecOutputs TokenByToken(const KdaModel& model, const std::vector<SpecRequest>& reqs) {
  const int64_t hidden = model.shape.hidden;
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
SpecOutputs Speculative(const KdaModel& model, const std::vector<SpecRequest>& reqs, bool extend_prompt,
                        VerifyMethod method) {
  const int64_t hidden = model.shape.hidden;
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
};

std::string CaseName(const ::testing::TestParamInfo<RollbackCase>& info) {
  const RollbackCase& c = info.param;
  return std::string(DTypeName(c.dtype)) + (c.weights == WeightFormat::kInt8 ? "_int8" : "_dense") +
         (c.extend_prompt ? "_extend" : "_decode") + "_" + VerifyMethodName(c.method);
}

class SpecRollbackTest : public ::testing::TestWithParam<RollbackCase> {};

// Rollback at every accepted count a for k = 0..7, all in one verify batch
// (variable k, k = 0 mixed in, fresh requests and prompts shorter than the
// conv window among them).
TEST_P(SpecRollbackTest, CommittedStatesAndKeptOutputsMatchTokenByTokenDecode) {
  const RollbackCase& c = GetParam();
  const KdaModel model = KdaModel::Random(SpecShape(), kLayers, c.dtype, 21, nullptr, c.weights);
  const std::vector<SpecRequest> reqs = MakeRequests(model.shape.hidden, 5);
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
  const KdaModel exact_model = KdaModel::Random(SpecShape(), kLayers, DType::kF32, 21, nullptr, c.weights);
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
    ::testing::Values(RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kRecompute},
                      RollbackCase{DType::kF32, WeightFormat::kDense, false, VerifyMethod::kRecompute},
                      RollbackCase{DType::kF32, WeightFormat::kDense, true, VerifyMethod::kTokenStates},
                      RollbackCase{DType::kF32, WeightFormat::kInt8, true, VerifyMethod::kRecompute},
                      RollbackCase{DType::kBF16, WeightFormat::kDense, false, VerifyMethod::kRecompute},
                      RollbackCase{DType::kBF16, WeightFormat::kDense, false, VerifyMethod::kTokenStates},
                      RollbackCase{DType::kBF16, WeightFormat::kInt8, false, VerifyMethod::kRecompute}),
    CaseName);

std::vector<float> Rows(int64_t n, int64_t hidden, float v) { return std::vector<float>(n * hidden, v); }

// A verify step leaves the committed states as they are; the slot takes no
// other batch until its commit; bad commits and batches are refused with
// nothing written.
TEST(SpecVerify, LeavesCommittedStatesAndRefusesOtherBatchesUntilItsCommit) {
  const KdaModel model = KdaModel::Random(SpecShape(), kLayers, DType::kF32, 3);
  const int64_t hidden = model.shape.hidden;
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
  const KdaLayerShape kimi{.H = 32, .K = 128, .W = 4};
  const int64_t base = RecurrentStatePool::BytesPerRequest(20, kimi, DType::kBF16);
  const VerifyConfig r{.max_draft_tokens = 3};
  const VerifyConfig s{.max_draft_tokens = 3, .method = VerifyMethod::kTokenStates};
  // Recompute: the 4 positions' projections (4P + H bf16 each) per layer.
  EXPECT_EQ(RecurrentStatePool::BytesPerRequest(20, kimi, DType::kBF16, r) - base, 20 * 4 * (4 * 4096 + 32) * 2);
  // Token states: plus a 2 MiB state per position and layer.
  EXPECT_EQ(RecurrentStatePool::BytesPerRequest(20, kimi, DType::kBF16, s) - base,
            20 * 4 * ((4 * 4096 + 32) * 2 + 32LL * 128 * 128 * 4));
  const KdaLayerShape small = SpecShape();
  const int64_t per = RecurrentStatePool::BytesPerRequest(2, small, DType::kF32, r);
  EXPECT_EQ(RecurrentStatePool::MaxRequestsForBudget(5 * per, 2, small, DType::kF32, r), 4);
  RecurrentStatePool pool(2, 4, small, DType::kF32, r);
  EXPECT_EQ(pool.total_bytes(), 5 * per);
}

}  // namespace
}  // namespace kda
