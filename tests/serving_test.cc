// The serving side: state pool, KDA backend per forward mode, scheduler
// invariance (chunked prefill, decode, slot reuse) on golden cases, and churn
// (with cancelled and failed requests: no slot or memory leaks).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/act_buffer.h"
#include "base/fault_inject.h"
#include "kda/base/parallel.h"
#include "kda/io/safetensors.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/radix_state_cache.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/mem_cache/recurrent_state_spec.h"
#include "kda/models/delta_rule_model.h"
#include "kda/serving/scheduler.h"
#include "kda/serving/serving_stack.h"
#include "tests/error_util.h"
#include "tests/golden.h"
#include "tests/thread_scope.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;

const DeltaRuleGeometry kSmall = DeltaRuleGeometry::Kda(/*hidden=*/48, /*heads=*/2, /*head_dim=*/16, /*conv_width=*/4,
                                                        /*eps=*/1e-5);
const RecurrentStateSpec kSmallSpec = kSmall.state_spec();

using testing::ErrorOf;

// The slots of requests that hold one, as a batch builder resolves them.
std::vector<int32_t> SlotsOf(const HybridReqToTokenPool& pool, const std::vector<int64_t>& ids) {
  std::vector<int32_t> slots;
  slots.reserve(ids.size());
  for (int64_t id : ids) slots.push_back(pool.SlotOf(id));
  return slots;
}

// A batch of the requests `ids` (their slots resolved in `pool`) with these
// extend and prefix lengths.
ForwardBatch BatchOf(const HybridReqToTokenPool& pool, ForwardMode mode, std::vector<int64_t> ids,
                     std::vector<int64_t> extend_lens, std::vector<int64_t> prefix_lens) {
  ForwardBatch b;
  b.mode = mode;
  b.req_pool_indices = SlotsOf(pool, ids);
  b.req_ids = std::move(ids);
  b.extend_lens = std::move(extend_lens);
  b.prefix_lens = std::move(prefix_lens);
  return b;
}

// --------------------------------------------------------------------- pool

TEST(RecurrentStatePool, HandsOutEverySlotButTheDummyThenRefuses) {
  RecurrentStatePool pool(2, 3, kSmallSpec, DType::kF32);
  EXPECT_EQ(pool.capacity(), 3);
  std::vector<int32_t> got = {pool.Alloc(), pool.Alloc(), pool.Alloc()};
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_THROW(pool.Alloc(), PoolExhaustedError);
  EXPECT_FALSE(pool.TryAlloc().has_value());
  pool.Free(2);
  EXPECT_EQ(pool.Alloc(), 2);
}

TEST(RecurrentStatePool, RefusesBadFreesAndLeavesThePoolUnchanged) {
  RecurrentStatePool pool(1, 2, kSmallSpec, DType::kF32);
  const int32_t a = pool.Alloc();
  EXPECT_NE(ErrorOf([&] { pool.Free(0); }).find("dummy"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { pool.Free(3); }).find("out of range"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { pool.Free(-1); }).find("out of range"), std::string::npos);
  pool.Free(a);
  EXPECT_NE(ErrorOf([&] { pool.Free(a); }).find("double free"), std::string::npos);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_NE(ErrorOf([&] { pool.GetLayerCache(1); }).find("layer 1"), std::string::npos);
}

TEST(RecurrentStatePool, ReusedSlotStartsFromZeroAndSlotsAreIsolated) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RecurrentStatePool pool(2, 2, kSmallSpec, dt);
    const int32_t a = pool.Alloc();
    const int32_t b = pool.Alloc();
    std::vector<float> rec(static_cast<size_t>(kSmallSpec.recurrent_size()), 3.5F);
    ActBuffer conv(dt, kSmallSpec.conv_size());
    for (int64_t i = 0; i < kSmallSpec.conv_size(); ++i) conv.Set(i, -1.25F);
    for (int l = 0; l < 2; ++l) pool.SetLayerState(l, a, rec.data(), conv.data());
    // b is untouched by writes to a.
    std::vector<float> got(rec.size(), 1.0F);
    ActBuffer got_conv(dt, kSmallSpec.conv_size());
    pool.GetLayerState(1, b, got.data(), got_conv.data());
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0F; }));
    // a's next owner sees zeros in every layer.
    pool.Free(a);
    const int32_t again = pool.Alloc();
    ASSERT_EQ(again, a);
    for (int l = 0; l < 2; ++l) {
      pool.GetLayerState(l, again, got.data(), got_conv.data());
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0F; }));
      const std::vector<float> c = got_conv.ToFloat();
      EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](float v) { return v == 0.0F; }));
    }
  }
}

TEST(RecurrentStatePool, DummySlotIsNeverWritten) {
  RecurrentStatePool pool(1, 1, kSmallSpec, DType::kF32);
  std::vector<float> rec(static_cast<size_t>(kSmallSpec.recurrent_size()), 7.0F);
  pool.SetLayerState(0, 0, rec.data(), nullptr);  // dropped
  const LayerStateCache c = pool.GetLayerCache(0);
  EXPECT_TRUE(std::all_of(c.recurrent, c.recurrent + kSmallSpec.recurrent_size(), [](float v) { return v == 0.0F; }));
  EXPECT_NE(ErrorOf([&] { pool.SetLayerState(0, 1, rec.data(), nullptr); }).find("not allocated"), std::string::npos);
}

TEST(RecurrentStatePool, SizedFromAByteBudget) {
  // Kimi-Linear: 20 KDA layers, 32 heads x 128, conv 4, bf16 tails: about 41.4 MiB per request.
  const DeltaRuleGeometry kimi =
      DeltaRuleGeometry::Kda(/*hidden=*/2304, /*heads=*/32, /*head_dim=*/128, /*conv_width=*/4, /*eps=*/1e-5);
  const int64_t per = RecurrentStatePool::BytesPerRequest(20, kimi.state_spec(), DType::kBF16);
  EXPECT_EQ(per, 20 * (32LL * 128 * 128 * 4 + 3LL * 3 * 4096 * 2));
  EXPECT_NEAR(static_cast<double>(per) / (1 << 20), 41.4, 0.05);
  const int64_t small = RecurrentStatePool::BytesPerRequest(2, kSmallSpec, DType::kF32);
  EXPECT_EQ(RecurrentStatePool::MaxRequestsForBudget(10 * small + small / 2, 2, kSmallSpec, DType::kF32), 9);
  EXPECT_NE(
      ErrorOf([&] { RecurrentStatePool::MaxRequestsForBudget(small, 2, kSmallSpec, DType::kF32); }).find("budget"),
      std::string::npos);
  // A server's capacity: its max_requests, bounded by a budget where one is set (0: none).
  EXPECT_EQ(RecurrentStatePool::CapacityWithinBudget(4, 10 * small + small / 2, 2, kSmallSpec, DType::kF32), 4);
  EXPECT_EQ(RecurrentStatePool::CapacityWithinBudget(16, 10 * small + small / 2, 2, kSmallSpec, DType::kF32), 9);
  EXPECT_EQ(RecurrentStatePool::CapacityWithinBudget(16, 0, 2, kSmallSpec, DType::kF32), 16);
  EXPECT_NE(
      ErrorOf([&] { RecurrentStatePool::CapacityWithinBudget(4, small, 2, kSmallSpec, DType::kF32); }).find("budget"),
      std::string::npos);
}

TEST(HybridReqToTokenPool, MapsRequestsToSlots) {
  RecurrentStatePool pool(1, 2, kSmallSpec, DType::kF32);
  HybridReqToTokenPool req(&pool);
  const int32_t s = req.Alloc(42);
  EXPECT_EQ(req.SlotOf(42), s);
  EXPECT_NE(ErrorOf([&] { req.Alloc(42); }).find("already"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { req.SlotOf(7); }).find("holds no"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { req.Free(7); }).find("holds no"), std::string::npos);
  req.Free(42);
  EXPECT_EQ(pool.num_free(), 2);
}

// ------------------------------------------------------------------ backend

DeltaRuleGeometry SmallShape() { return kSmall; }  // hidden 48

ActBuffer RandomRows(DType dt, int64_t rows, int64_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  ActBuffer b(dt, rows * hidden);
  for (int64_t i = 0; i < rows * hidden; ++i) b.Set(i, normal(rng));
  return b;
}

class BackendTest : public ::testing::Test {
 protected:
  BackendTest()
      : model_(DeltaRuleModel::Random("kimi_linear", SmallShape(), 1, DType::kF32, 5)),
        pool_(1, 4, kSmallSpec, DType::kF32),
        req_(&pool_),
        backend_({&pool_, &req_}, KernelImpl::kReference) {}

  std::vector<float> PoolSnapshot() {
    const LayerStateCache c = pool_.GetLayerCache(0);
    std::vector<float> s(c.recurrent, c.recurrent + c.num_slots * kSmallSpec.recurrent_size());
    const auto* conv = static_cast<const float*>(c.conv);
    s.insert(s.end(), conv, conv + c.num_slots * kSmallSpec.conv_size());
    return s;
  }

  DeltaRuleModel model_;
  RecurrentStatePool pool_;
  HybridReqToTokenPool req_;
  DeltaRuleAttnBackend backend_;
};

TEST_F(BackendTest, MetadataIsComputedOncePerBatch) {
  req_.Alloc(10);
  req_.Alloc(11);
  const ForwardBatch b = BatchOf(req_, ForwardMode::kExtend, {11, 10}, {3, 5}, {0, 4});
  backend_.InitForwardMetadata(b);
  const LinearAttnMetadata& md = backend_.metadata();
  EXPECT_EQ(md.cu_q_lens, (std::vector<int64_t>{0, 3, 8}));
  EXPECT_EQ(md.recurrent_indices, (std::vector<int32_t>{req_.SlotOf(11), req_.SlotOf(10)}));
  EXPECT_EQ(md.has_initial_state, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(md.num_tokens, 8);
}

TEST_F(BackendTest, RefusesUnsupportedModesAndBadBatches) {
  req_.Alloc(1);
  for (ForwardMode m : {ForwardMode::kMixed, ForwardMode::kDraftExtend}) {
    const ForwardBatch b = BatchOf(req_, m, {1}, {1}, {0});
    EXPECT_NE(ErrorOf([&] { backend_.InitForwardMetadata(b); }).find("not supported"), std::string::npos)
        << ForwardModeName(m);
  }
  // TARGET_VERIFY needs a pool with a verify area (speculative_test.cc).
  const ForwardBatch v = BatchOf(req_, ForwardMode::kTargetVerify, {1}, {1}, {0});
  EXPECT_NE(ErrorOf([&] { backend_.InitForwardMetadata(v); }).find("verify area"), std::string::npos);
  ForwardBatch d = BatchOf(req_, ForwardMode::kDecode, {1}, {2}, {4});
  EXPECT_NE(ErrorOf([&] { backend_.InitForwardMetadata(d); }).find("one token"), std::string::npos);
  d.extend_lens = {1};
  d.req_ids = {99};  // holds no slot: the batch's slot is request 1's
  EXPECT_NE(ErrorOf([&] { backend_.InitForwardMetadata(d); }).find("request 99 does not hold state slot"),
            std::string::npos);
  d.req_ids = {1};
  d.req_pool_indices = {d.req_pool_indices[0] + 1};  // another slot than request 1's
  EXPECT_NE(ErrorOf([&] { backend_.InitForwardMetadata(d); }).find("request 1 does not hold state slot"),
            std::string::npos);
  d.req_pool_indices = {d.req_pool_indices[0] - 1};
  d.req_ids = {1, 1};
  d.req_pool_indices = {d.req_pool_indices[0], d.req_pool_indices[0]};
  d.extend_lens = {1, 1};
  d.prefix_lens = {1, 1};
  EXPECT_NE(ErrorOf([&] { backend_.InitForwardMetadata(d); }).find("twice"), std::string::npos);
}

TEST_F(BackendTest, IdleWritesNothingAndLeavesThePoolUntouched) {
  const int32_t slot = req_.Alloc(3);
  std::vector<float> rec(static_cast<size_t>(kSmallSpec.recurrent_size()), 0.25F);
  pool_.SetLayerState(0, slot, rec.data(), nullptr);
  const std::vector<float> before = PoolSnapshot();
  ForwardBatch idle;
  idle.mode = ForwardMode::kIdle;
  backend_.InitForwardMetadata(idle);
  ActBuffer out(DType::kF32, 0);
  model_.layers[0]->Forward(out.mut(), ActBuffer(DType::kF32, 0).view(), backend_);
  EXPECT_EQ(PoolSnapshot(), before);
}

// A slot holding someone else's state, used by a fresh request (prefix 0,
// not seeded): the result equals a run from a zeroed slot.
TEST_F(BackendTest, FreshRequestIgnoresWhatItsSlotHolds) {
  const DeltaRuleGeometry s = SmallShape();
  const ActBuffer x = RandomRows(DType::kF32, 6, s.hidden, 9);
  auto run = [&](float garbage) {
    const int32_t slot = req_.Alloc(5);
    std::vector<float> rec(static_cast<size_t>(kSmallSpec.recurrent_size()), garbage);
    std::vector<float> conv(static_cast<size_t>(kSmallSpec.conv_size()), garbage);
    pool_.SetLayerState(0, slot, rec.data(), conv.data());
    const ForwardBatch b = BatchOf(req_, ForwardMode::kExtend, {5}, {6}, {0});
    backend_.InitForwardMetadata(b);
    ActBuffer out(DType::kF32, 6 * s.hidden);
    model_.layers[0]->Forward(out.mut(), x.view(), backend_);
    std::vector<float> r = out.ToFloat();
    pool_.GetLayerState(0, slot, rec.data(), conv.data());
    r.insert(r.end(), rec.begin(), rec.end());
    r.insert(r.end(), conv.begin(), conv.end());
    req_.Free(5);
    return r;
  };
  EXPECT_EQ(run(0.0F), run(123.0F));
}

// EXTEND reads and writes the states in place in the batch's slots, with
// either kernel: a fresh request's slot holds garbage that must not be read,
// a continuing request's slot its state; a slot outside the batch and the
// dummy slot stay as they are, and both kernels agree.
TEST_F(BackendTest, ExtendUpdatesOnlyItsSlotsInPlace) {
  const DeltaRuleGeometry s = SmallShape();
  const ActBuffer x = RandomRows(DType::kF32, 7, s.hidden, 21);
  std::vector<std::vector<float>> results;
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    SCOPED_TRACE(KernelImplName(impl));
    DeltaRuleAttnBackend backend({&pool_, &req_}, impl);
    const int32_t fresh = req_.Alloc(1);
    const int32_t cont = req_.Alloc(2);
    const int32_t outside = req_.Alloc(3);
    std::vector<float> garbage(static_cast<size_t>(kSmallSpec.recurrent_size()), 1e30F);
    std::vector<float> conv_garbage(static_cast<size_t>(kSmallSpec.conv_size()), 1e30F);
    std::vector<float> h0(garbage.size());
    std::vector<float> conv0(conv_garbage.size());
    for (size_t i = 0; i < h0.size(); ++i) h0[i] = 0.01F * static_cast<float>(i % 17) - 0.08F;
    for (size_t i = 0; i < conv0.size(); ++i) conv0[i] = 0.1F * static_cast<float>(i % 5) - 0.2F;
    pool_.SetLayerState(0, fresh, garbage.data(), conv_garbage.data());
    pool_.SetLayerState(0, cont, h0.data(), conv0.data());
    pool_.SetLayerState(0, outside, h0.data(), conv0.data());
    const ForwardBatch b = BatchOf(req_, ForwardMode::kExtend, {2, 1}, {3, 4}, {5, 0});
    backend.InitForwardMetadata(b);
    ActBuffer out(DType::kF32, 7 * s.hidden);
    model_.layers[0]->Forward(out.mut(), x.view(), backend);
    std::vector<float> r = out.ToFloat();
    for (int32_t slot : {fresh, cont}) {
      std::vector<float> rec(h0.size());
      std::vector<float> conv(conv0.size());
      pool_.GetLayerState(0, slot, rec.data(), conv.data());
      EXPECT_TRUE(std::all_of(rec.begin(), rec.end(), [](float v) { return std::fabs(v) < 1e3F; })) << slot;
      EXPECT_NE(rec, h0) << slot;
      r.insert(r.end(), rec.begin(), rec.end());
      r.insert(r.end(), conv.begin(), conv.end());
    }
    std::vector<float> rec(h0.size());
    std::vector<float> conv(conv0.size());
    pool_.GetLayerState(0, outside, rec.data(), conv.data());
    EXPECT_EQ(rec, h0);
    EXPECT_EQ(conv, conv0);
    const LayerStateCache c = pool_.GetLayerCache(0);
    EXPECT_TRUE(std::all_of(c.recurrent, c.recurrent + kSmallSpec.recurrent_size(), [](float v) { return v == 0.0F; }));
    for (int64_t req : {1, 2, 3}) req_.Free(req);
    results.push_back(std::move(r));
  }
  EXPECT_TRUE(AllCloseF32(results[1].data(), results[0].data(), results[0].size()));
}

TEST_F(BackendTest, DecodeUpdatesOnlyItsSlotsInPlace) {
  const DeltaRuleGeometry s = SmallShape();
  const int32_t a = req_.Alloc(1);
  const int32_t b = req_.Alloc(2);
  const int32_t idle = req_.Alloc(3);
  const ForwardBatch pre = BatchOf(req_, ForwardMode::kExtend, {1, 2, 3}, {4, 2, 3}, {0, 0, 0});
  backend_.InitForwardMetadata(pre);
  const ActBuffer x = RandomRows(DType::kF32, 9, s.hidden, 3);
  ActBuffer out(DType::kF32, 9 * s.hidden);
  model_.layers[0]->Forward(out.mut(), x.view(), backend_);
  std::vector<float> idle_before(static_cast<size_t>(kSmallSpec.recurrent_size()));
  pool_.GetLayerState(0, idle, idle_before.data(), nullptr);
  std::vector<float> a_before(idle_before.size());
  pool_.GetLayerState(0, a, a_before.data(), nullptr);

  const ForwardBatch dec = BatchOf(req_, ForwardMode::kDecode, {2, 1}, {1, 1}, {2, 4});
  backend_.InitForwardMetadata(dec);
  ActBuffer out2(DType::kF32, 2 * s.hidden);
  model_.layers[0]->Forward(out2.mut(), RandomRows(DType::kF32, 2, s.hidden, 4).view(), backend_);
  std::vector<float> idle_after(idle_before.size());
  std::vector<float> a_after(idle_before.size());
  pool_.GetLayerState(0, idle, idle_after.data(), nullptr);
  pool_.GetLayerState(0, a, a_after.data(), nullptr);
  EXPECT_EQ(idle_after, idle_before);
  EXPECT_NE(a_after, a_before);
  (void)b;
  // The dummy slot stays zero.
  const LayerStateCache c = pool_.GetLayerCache(0);
  EXPECT_TRUE(std::all_of(c.recurrent, c.recurrent + kSmallSpec.recurrent_size(), [](float v) { return v == 0.0F; }));
}

TEST(ServerArgs, MixedChunkIsRefusedAndRadixCacheDisabled) {
  SchedulerConfig c;
  c.enable_mixed_chunk = true;
  EXPECT_NE(ErrorOf([&] { CheckServerArgs(c); }).find("mixed chunk"), std::string::npos);
  c.enable_mixed_chunk = false;
  c.enable_radix_cache = true;
  const std::vector<std::string> notes = CheckServerArgs(c);
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("radix"), std::string::npos);
  EXPECT_FALSE(c.enable_radix_cache);
}

// ------------------------------------------------------------------- runner

// What a ModelRunner's observer is shown: the batches, and every layer's input
// and output (fp32 values, by pool layer).
struct LayerIo : LayerObserver {
  int batches = 0;
  std::map<int, std::vector<float>> in, out;

  void OnBatch(const ForwardBatch& /*batch*/) override { ++batches; }
  void OnTensor(int layer_id, LayerTensor which, ConstBuf values, int64_t count) override {
    if (which != LayerTensor::kInput && which != LayerTensor::kOutput) return;
    std::vector<float>& dst = (which == LayerTensor::kInput ? in : out)[layer_id];
    dst.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) dst[i] = LoadAsFloat(values.data, values.dtype, static_cast<size_t>(i));
  }
};

TEST(ModelRunner, ObserverSeesEveryLayersInputAndOutput) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 2, DType::kF32, 9);
  RecurrentStatePool pool(model.num_layers(), 2, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req}, KernelImpl::kReference);
  LayerIo io;
  runner.SetObserver(&io);
  req.Alloc(1);
  req.Alloc(2);
  ForwardBatch batch = BatchOf(req, ForwardMode::kExtend, {1, 2}, {3, 4}, {0, 0});
  const int64_t hidden = model.geometry.hidden;
  const ActBuffer x = RandomRows(DType::kF32, 7, hidden, 3);
  ActBuffer out(DType::kF32, 7 * hidden);
  runner.Forward(batch, x.view(), out.mut());
  EXPECT_EQ(io.batches, 1);
  ASSERT_EQ(io.in.size(), 2U);
  ASSERT_EQ(io.out.size(), 2U);
  EXPECT_EQ(io.in[0], x.ToFloat());
  // The residual stream: layer 1 reads x + layer 0's output; out is layer 1's.
  std::vector<float> h1 = x.ToFloat();
  ASSERT_EQ(io.out[0].size(), h1.size());
  for (size_t i = 0; i < h1.size(); ++i) h1[i] += io.out[0][i];
  EXPECT_EQ(io.in[1], h1);
  EXPECT_EQ(io.out[1], out.ToFloat());

  // Observer off: the next batch is not shown.
  runner.SetObserver(nullptr);
  batch.mode = ForwardMode::kDecode;
  batch.extend_lens = {1, 1};
  batch.prefix_lens = {3, 4};
  const ActBuffer x2 = RandomRows(DType::kF32, 2, hidden, 4);
  ActBuffer out2(DType::kF32, 2 * hidden);
  runner.Forward(batch, x2.view(), out2.mut());
  EXPECT_EQ(io.batches, 1);
  EXPECT_EQ(io.out[1], out.ToFloat());
}

// ------------------------------------------------------ scheduler invariance

struct Served {
  std::vector<float> out, rec, conv;
};

// Serves each sequence of a packed batch as a request; returns rows in input
// order and per-sequence final states (one layer).
Served ServeBatch(const DeltaRuleModel& model, const ActBuffer& x, const std::vector<int64_t>& cu,
                  const float* init_rec, const ActBuffer* init_conv, const std::vector<int64_t>& decode,
                  SchedulerConfig cfg, int64_t slots) {
  const auto N = static_cast<int64_t>(cu.size()) - 1;
  RecurrentStatePool pool(model.num_layers(), slots, model.state_spec(), model.act_dtype);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req}, KernelImpl::kReference);
  Scheduler sched(runner, cfg);
  const int64_t hidden = model.geometry.hidden;
  const int64_t rs = model.state_spec().recurrent_size();
  const int64_t cs = model.state_spec().conv_size();
  for (int64_t n = 0; n < N; ++n) {
    sched.Submit({.id = n,
                  .input = Offset(x.view(), cu[n] * hidden),
                  .length = cu[n + 1] - cu[n],
                  .decode_tokens = decode[n],
                  .initial_recurrent = init_rec != nullptr ? init_rec + n * rs : nullptr,
                  .initial_conv = init_conv != nullptr ? Offset(init_conv->view(), n * cs).data : nullptr});
  }
  sched.RunToCompletion();
  EXPECT_EQ(pool.num_free(), slots);
  Served s;
  s.out.assign(static_cast<size_t>(cu.back() * hidden), 0.0F);
  s.rec.assign(static_cast<size_t>(N * rs), 0.0F);
  s.conv.assign(static_cast<size_t>(N * cs), 0.0F);
  EXPECT_EQ(static_cast<int64_t>(sched.finished().size()), N);
  for (const RequestResult& r : sched.finished()) {
    for (size_t i = 0; i < r.out.size() / DTypeSize(model.act_dtype); ++i) {
      s.out[cu[r.id] * hidden + i] = LoadAsFloat(r.out.data(), model.act_dtype, i);
    }
    std::copy(r.final_recurrent.begin(), r.final_recurrent.end(), s.rec.begin() + r.id * rs);
    for (int64_t i = 0; i < cs; ++i) s.conv[r.id * cs + i] = LoadAsFloat(r.final_conv.data(), model.act_dtype, i);
  }
  return s;
}

struct InvarianceCase {
  std::string dir, name;
};

void PrintTo(const InvarianceCase& c, std::ostream* os) { *os << c.dir << "/" << c.name; }

class GoldenInvarianceTest : public ::testing::TestWithParam<InvarianceCase> {};

TEST_P(GoldenInvarianceTest, ChunkedPrefillAndDecodeMatchTheGoldenOutput) {
  const std::string dir = testing::GoldenSetDir(GetParam().dir);
  const std::string file = dir + "/" + GetParam().name + ".safetensors";
  KDA_REQUIRE_GOLDEN_PATH(file);
  const SafetensorsFile f = SafetensorsFile::Open(file);
  const std::vector<int64_t> cu = ToInt64Vector(f.Get("cu_seqlens"));
  const auto N = static_cast<int64_t>(cu.size()) - 1;
  const bool init = f.Has("initial_recurrent_state");
  const std::vector<float> xf = ToFloatVector(f.Get("hidden_states"));
  std::mt19937 rng(17);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const DeltaRuleModel model = DeltaRuleModel::Load(dir, dt, 0);
    ActBuffer x(dt, static_cast<int64_t>(xf.size()));
    for (size_t i = 0; i < xf.size(); ++i) x.Set(static_cast<int64_t>(i), xf[i]);
    std::vector<float> rec;
    ActBuffer conv;
    if (init) {
      rec = ToFloatVector(f.Get("initial_recurrent_state"));
      const std::vector<float> c = ToFloatVector(f.Get("initial_conv_state"));
      conv = ActBuffer(dt, static_cast<int64_t>(c.size()));
      for (size_t i = 0; i < c.size(); ++i) conv.Set(static_cast<int64_t>(i), c[i]);
    }
    const std::vector<float> want_out = ToFloatVector(f.Get(dt == DType::kF32 ? "out_fp32" : "out_bf16"));
    const std::vector<float> want_rec =
        ToFloatVector(f.Get(dt == DType::kF32 ? "final_recurrent_state" : "final_recurrent_state_bf16"));
    const std::vector<float> exact_out = ToFloatVector(f.Get("out_fp32"));
    const std::vector<float> exact_rec = ToFloatVector(f.Get("final_recurrent_state"));
    // Three schedules: decode the last k >= 8 tokens; random chunked prefill
    // splits with few slots; both together.
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<int64_t> decode(static_cast<size_t>(N), 0);
      SchedulerConfig cfg;
      int64_t slots = N;
      if (variant != 1) {
        for (int64_t n = 0; n < N; ++n) decode[n] = std::min<int64_t>(cu[n + 1] - cu[n], 8 + rng() % 5);
      }
      if (variant != 0) {
        cfg.prefill_chunk = 1 + rng() % 40;
        cfg.step_token_budget = 16 + rng() % 100;
        slots = std::max<int64_t>(1, N / 2);
      }
      const Served s =
          ServeBatch(model, x, cu, init ? rec.data() : nullptr, init ? &conv : nullptr, decode, cfg, slots);
      const std::string what = std::string(DTypeName(dt)) + " variant " + std::to_string(variant);
      if (dt == DType::kF32) {
        EXPECT_TRUE(AllCloseF32(s.out.data(), want_out.data(), want_out.size())) << what;
        EXPECT_TRUE(testing::AllCloseStateF32(s.rec.data(), want_rec.data(), want_rec.size())) << what;
        const std::vector<float> want_conv = ToFloatVector(f.Get("final_conv_state"));
        EXPECT_TRUE(testing::AllCloseStateF32(s.conv.data(), want_conv.data(), want_conv.size())) << what;
      } else {
        EXPECT_TRUE(AllCloseBF16(s.out.data(), want_out.data(), exact_out.data(), want_out.size())) << what;
        EXPECT_TRUE(AllCloseBF16(s.rec.data(), want_rec.data(), exact_rec.data(), want_rec.size())) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Golden, GoldenInvarianceTest,
    ::testing::Values(
        InvarianceCase{"kda-mini", "single_T128"}, InvarianceCase{"kda-mini", "single_T65"},
        InvarianceCase{"kda-mini", "varlen_unbalanced_5_17_1_41"}, InvarianceCase{"kda-mini", "varlen_initstate"},
        InvarianceCase{"kda-mini", "single_T128_initstate"}, InvarianceCase{"kda-stress", "stress_T300"},
        InvarianceCase{"kda-stress", "stress_varlen_initstate"},
        InvarianceCase{"generated/kda-real", "real_varlen_initstate"}, InvarianceCase{"gdn-mini", "single_T128"},
        InvarianceCase{"gdn-mini", "varlen_unbalanced_5_17_1_41"},
        InvarianceCase{"gdn-mini", "varlen_initstate_short_1_2_3_70"}, InvarianceCase{"gdn-gva3", "single_T200"},
        InvarianceCase{"gdn-gva3", "varlen_initstate"}, InvarianceCase{"gdn-loud", "loud_T300"},
        InvarianceCase{"gdn-loud", "loud_varlen_initstate"},
        // The other families' variants (tools/delta_rule_ref.py).
        InvarianceCase{"generated/glm5-mini", "single_T130"}, InvarianceCase{"generated/glm5-mini", "varlen_initstate"},
        InvarianceCase{"generated/bailing-mini", "varlen_initstate"},
        InvarianceCase{"generated/olmo-mini", "single_T130"}, InvarianceCase{"generated/olmo-mini", "varlen_initstate"},
        InvarianceCase{"generated/lara-mini", "varlen_unbalanced_5_17_1_41"},
        InvarianceCase{"generated/qwen4-mini", "varlen_initstate"}),
    [](const ::testing::TestParamInfo<InvarianceCase>& info) {
      std::string s = info.param.dir + "_" + info.param.name;
      std::replace(s.begin(), s.end(), '-', '_');
      std::replace(s.begin(), s.end(), '/', '_');
      return s;
    });

// Many more requests than slots: every request's output equals its one-shot
// run, and the pool ends with every slot free.
TEST(SchedulerChurn, ThousandRequestsThroughEightSlots) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 2, DType::kF32, 11);
  const int64_t hidden = model.geometry.hidden;
  constexpr int kRequests = 1000;
  std::mt19937 rng(3);
  std::vector<ActBuffer> inputs;
  std::vector<int64_t> lens;
  std::vector<int64_t> decodes;
  for (int i = 0; i < kRequests; ++i) {
    lens.push_back(rng() % 24);
    decodes.push_back(rng() % 6);
    inputs.push_back(RandomRows(DType::kF32, lens.back(), hidden, 1000 + i));
  }
  RecurrentStatePool pool(model.num_layers(), 8, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req}, KernelImpl::kReference);
  SchedulerConfig cfg;
  cfg.prefill_chunk = 7;
  cfg.step_token_budget = 40;
  Scheduler sched(runner, cfg);
  for (int i = 0; i < kRequests; ++i) sched.Submit({i, inputs[i].view(), lens[i], decodes[i], nullptr, nullptr});
  sched.RunToCompletion();
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_EQ(req.size(), 0);
  ASSERT_EQ(static_cast<int>(sched.finished().size()), kRequests);

  // One-shot reference for each request: alone, one EXTEND step.
  RecurrentStatePool pool1(model.num_layers(), 1, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req1(&pool1);
  ModelRunner runner1(model, {&pool1, &req1}, KernelImpl::kReference);
  int checked = 0;
  for (const RequestResult& r : sched.finished()) {
    const int64_t n = lens[r.id];
    std::vector<float> want_state(static_cast<size_t>(model.num_layers() * model.state_spec().recurrent_size()));
    std::vector<float> want(static_cast<size_t>(n * hidden));
    req1.Alloc(r.id);
    if (n > 0) {
      const ForwardBatch b = BatchOf(req1, ForwardMode::kExtend, {r.id}, {n}, {0});
      runner1.Forward(b, inputs[r.id].view(), {want.data(), DType::kF32});
    }
    for (int l = 0; l < model.num_layers(); ++l) {
      pool1.GetLayerState(l, req1.SlotOf(r.id), want_state.data() + l * model.state_spec().recurrent_size(), nullptr);
    }
    req1.Free(r.id);
    std::vector<float> got(want.size());
    ASSERT_EQ(r.out.size(), got.size() * sizeof(float));
    if (!got.empty()) std::memcpy(got.data(), r.out.data(), r.out.size());
    ASSERT_TRUE(AllCloseF32(got.data(), want.data(), want.size())) << "request " << r.id;
    ASSERT_TRUE(AllCloseF32(r.final_recurrent.data(), want_state.data(), want_state.size())) << "request " << r.id;
    ++checked;
  }
  EXPECT_EQ(checked, kRequests);
}

TEST(Scheduler, QueuesWhenSlotsRunOutAndRefusesBadRequests) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 1, DType::kF32, 2);
  RecurrentStatePool pool(1, 2, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req}, KernelImpl::kReference);
  Scheduler sched(runner, SchedulerConfig{});
  const ActBuffer x = RandomRows(DType::kF32, 4, model.geometry.hidden, 1);
  for (int i = 0; i < 5; ++i) sched.Submit({i, x.view(), 4, 2, nullptr, nullptr});
  EXPECT_NE(ErrorOf([&] { sched.Submit({3, x.view(), 4, 0, nullptr, nullptr}); }).find("already"), std::string::npos);
  ASSERT_TRUE(sched.Step());
  EXPECT_EQ(sched.num_running(), 2);
  EXPECT_EQ(sched.num_waiting(), 3);
  sched.RunToCompletion();
  EXPECT_EQ(sched.finished().size(), 5U);
  EXPECT_EQ(pool.num_free(), 2);
}

// Resident set size of this process in bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// 10,000 requests of random lengths through 8 slots, in rounds, with requests
// cancelled while waiting or mid-way and forward failures injected: every
// request ends exactly once (finished or failed), every slot is free after
// each round, and resident memory stays flat after the first round.
TEST(SchedulerChurn, TenThousandRequestsWithFailuresLeakNoSlotAndNoMemory) {
  // Tiny shapes: one thread (workers would only wait on each other).
  const testing::ThreadScope one_thread(1);
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 2, DType::kF32, 13);
  const int64_t hidden = model.geometry.hidden;
  constexpr int kRounds = 10;
  constexpr int kPerRound = 1000;
  constexpr int64_t kMaxLen = 32;
  const ActBuffer x = RandomRows(DType::kF32, kMaxLen, hidden, 21);  // every request reads a prefix of it
  RecurrentStatePool pool(model.num_layers(), 8, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req});
  SchedulerConfig cfg;
  cfg.prefill_chunk = 7;
  cfg.step_token_budget = 40;
  Scheduler sched(runner, cfg);
  std::mt19937 rng(5);
  int64_t rss_after_warmup = 0;
  int64_t finished = 0;
  int64_t cancelled = 0;
  int64_t failed_in_forward = 0;
  int64_t forward_errors = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<int64_t> lens(kPerRound);
    for (int i = 0; i < kPerRound; ++i) {
      const int64_t id = static_cast<int64_t>(round) * kPerRound + i;
      lens[i] = rng() % (kMaxLen + 1);
      sched.Submit({id, x.view(), lens[i], static_cast<int64_t>(rng() % 6), nullptr, nullptr});
    }
    // Cancel a few while they wait, and a few once they run.
    for (int i = 0; i < kPerRound; i += 97) EXPECT_TRUE(sched.Cancel(static_cast<int64_t>(round) * kPerRound + i));
    // One forward failure per round, a few hundred layer forwards in.
    SetFaultInjection("rank:0,at:forward,skip:" + std::to_string(100 + 37 * round));
    int64_t steps = 0;
    for (;;) {
      bool more = false;
      try {
        more = sched.Step();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fault injected"), std::string::npos) << e.what();
        ++forward_errors;
        more = true;
      }
      if (!more) break;
      if (++steps % 50 == 0 && sched.num_running() > 0) {
        // The oldest running request, mid-way.
        const int64_t before = sched.num_running();
        for (int64_t id = static_cast<int64_t>(round) * kPerRound; id < (round + 1) * kPerRound; ++id) {
          if (req.Has(id)) {
            EXPECT_TRUE(sched.Cancel(id));
            break;
          }
        }
        EXPECT_EQ(sched.num_running(), before - 1);
      }
      EXPECT_EQ(pool.num_free() + req.size(), 8) << "a slot is neither free nor held by a request";
    }
    SetFaultInjection("");
    EXPECT_EQ(sched.num_waiting(), 0);
    EXPECT_EQ(sched.num_running(), 0);
    ASSERT_EQ(pool.num_free(), 8) << "round " << round;
    ASSERT_EQ(req.size(), 0) << "round " << round;
    // Every request of the round ended exactly once.
    std::vector<int> seen(kPerRound, 0);
    const std::vector<RequestResult> done = sched.TakeFinished();
    for (const RequestResult& r : done) {
      ++seen[r.id - static_cast<int64_t>(round) * kPerRound];
      EXPECT_EQ(r.out.size(), static_cast<size_t>(lens[r.id % kPerRound] * hidden) * sizeof(float));
    }
    for (const FailedRequest& f : sched.TakeFailed()) {
      ++seen[f.id - static_cast<int64_t>(round) * kPerRound];
      if (f.error == "cancelled") {
        ++cancelled;
      } else {
        EXPECT_NE(f.error.find("fault injected"), std::string::npos) << f.error;
        ++failed_in_forward;
      }
    }
    for (int i = 0; i < kPerRound; ++i) ASSERT_EQ(seen[i], 1) << "request " << round * kPerRound + i;
    finished += static_cast<int64_t>(done.size());
    if (round == 0) rss_after_warmup = ResidentBytes();
  }
  EXPECT_EQ(forward_errors, kRounds);
  EXPECT_GE(failed_in_forward, kRounds);  // each failure takes its whole batch
  EXPECT_GE(cancelled, kRounds * (kPerRound / 97));
  EXPECT_EQ(finished + cancelled + failed_in_forward, kRounds * kPerRound);
  EXPECT_GT(finished, kRounds * kPerRound * 8 / 10);
  const int64_t growth = ResidentBytes() - rss_after_warmup;
#ifdef KDA_SANITIZED
  // AddressSanitizer holds freed blocks in its quarantine (up to 256 MiB), so
  // resident memory is not flat there; LeakSanitizer checks for leaks instead.
  (void)growth;
#else
  EXPECT_LT(growth, int64_t{4} << 20) << "resident memory grew by " << growth << " bytes after the first round";
#endif
}

// A request that can never get a slot is a clear error, not a wait forever;
// a pool that cannot be allocated is one too.
TEST(Scheduler, RefusesWhatCanNeverRunAndFailedAllocations) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 1, DType::kF32, 2);
  RecurrentStatePool pool(1, 2, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req}, KernelImpl::kReference);
  const ActBuffer x = RandomRows(DType::kF32, 4, model.geometry.hidden, 1);
  req.Alloc(100);  // both slots held outside the scheduler
  req.Alloc(101);
  {
    SchedulerConfig cfg;
    cfg.max_running = 0;  // the pool's capacity
    Scheduler sched(runner, cfg);
    sched.Submit({1, x.view(), 4, 0, nullptr, nullptr});
    const std::string e = ErrorOf([&] { sched.RunToCompletion(); });
    EXPECT_NE(e.find("1 requests wait for a state slot, but all 2 slots of the pool are held outside"),
              std::string::npos)
        << e;
    EXPECT_EQ(sched.num_waiting(), 1);
    EXPECT_FALSE(sched.Cancel(7));
    EXPECT_TRUE(sched.Cancel(1));
    sched.RunToCompletion();  // nothing left
  }
  req.Free(100);
  req.Free(101);
  SchedulerConfig bad;
  bad.max_running = -1;
  EXPECT_NE(ErrorOf([&] { Scheduler s(runner, bad); }).find("max_running must be >= 0"), std::string::npos);
  // A scheduler that stops on an error gives its slots back when destroyed.
  {
    Scheduler sched(runner, SchedulerConfig{});
    sched.Submit({1, x.view(), 4, 2, nullptr, nullptr});
    sched.Submit({2, x.view(), 4, 2, nullptr, nullptr});
    ASSERT_TRUE(sched.Step());
    EXPECT_EQ(pool.num_free(), 0);
  }
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(req.size(), 0);
  // The allocation of a pool fails: a kda::Error naming the bytes.
  SetFaultInjection("rank:0,at:alloc");
  const std::string e = ErrorOf([&] { RecurrentStatePool p(2, 8, model.state_spec(), DType::kF32); });
  SetFaultInjection("");
  EXPECT_NE(e.find("state pool: cannot allocate " +
                   std::to_string(9 * RecurrentStatePool::BytesPerRequest(2, model.state_spec(), DType::kF32)) +
                   " bytes (8 slots"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("out of memory"), std::string::npos) << e;
  // A malformed switch is refused at the first check, never ignored.
  SetFaultInjection("rank:0,at:nowhere");
  EXPECT_NE(ErrorOf([&] { MaybeInjectFault(FaultPoint::kLoad); }).find("KDA_FAULT_INJECT: bad entry 'at:nowhere'"),
            std::string::npos);
  SetFaultInjection("at:load");
  EXPECT_NE(ErrorOf([&] { MaybeInjectFault(FaultPoint::kLoad); }).find("needs rank:R"), std::string::npos);
  SetFaultInjection("");
  MaybeInjectFault(FaultPoint::kLoad);
}

}  // namespace
// ------------------------------------------------------------ serving stack

TEST(ServingOptions, EachRuleNamesItsOptionInBothSpellings) {
  struct Case {
    void (*spoil)(ServingOptions&);
    const char* field;
    const char* flag;
  };
  const Case cases[] = {
      {[](ServingOptions& o) { o.scheduler.max_running = -1; }, "max_running must be >= 0", "--max-running must"},
      {[](ServingOptions& o) { o.scheduler.prefill_chunk = -3; }, "prefill_chunk must be >= 0", "--prefill-chunk"},
      {[](ServingOptions& o) { o.scheduler.step_token_budget = 0; }, "step_token_budget must be >= 1",
       "--step-tokens must be >= 1"},
      {[](ServingOptions& o) { o.scheduler.snapshot_interval = 100; }, "snapshot_interval must be a positive multiple",
       "--snapshot-interval must"},
      {[](ServingOptions& o) { o.state_budget_bytes = -(1 << 20); }, "state_budget_bytes must be >= 0",
       "--state-budget-mib must be >= 0 (0: no limit), got -1 MiB"},
      {[](ServingOptions& o) { o.prefix_cache_bytes = -1; }, "prefix_cache_bytes must be >= 0", "--prefix-cache-mib"},
      {[](ServingOptions& o) { o.verify.max_draft_tokens = 65; }, "max_draft_tokens must be in [0, 64]",
       "--max-draft-tokens"},
  };
  EXPECT_NO_THROW(ValidateServingOptions(ServingOptions{}));
  for (const Case& c : cases) {
    ServingOptions o;
    c.spoil(o);
    EXPECT_NE(ErrorOf([&] { ValidateServingOptions(o); }).find(c.field), std::string::npos) << c.field;
    EXPECT_NE(ErrorOf([&] { ValidateServingOptions(o, OptionNames::kFlags); }).find(c.flag), std::string::npos)
        << c.flag;
  }
  RadixStateCache cache(1, kSmallSpec, DType::kF32, 1 << 20);
  ServingOptions o;
  o.scheduler.prefix_cache = &cache;
  EXPECT_NE(ErrorOf([&] { ValidateServingOptions(o); }).find("prefix_cache_bytes"), std::string::npos);
}

TEST(ServingOptions, CapacityIsMaxRunningBoundedByTheRequestsAndTheBudget) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 2, DType::kF32, 5);
  const int64_t per = RecurrentStatePool::BytesPerRequest(2, model.state_spec(), DType::kF32);
  ServingOptions o;
  EXPECT_EQ(ServingCapacity(model, o, 7), 7);  // 0: every request
  o.scheduler.max_running = 3;
  EXPECT_EQ(ServingCapacity(model, o, 7), 3);
  EXPECT_EQ(ServingCapacity(model, o, 2), 2);
  EXPECT_EQ(ServingCapacity(model, o), 3);  // requests not known ahead
  o.state_budget_bytes = 3 * per;           // the dummy slot counts: two requests fit
  EXPECT_EQ(ServingCapacity(model, o, 7), 2);
  o.scheduler.max_running = 0;
  EXPECT_EQ(ServingCapacity(model, o), 2);  // what the budget holds
  o.state_budget_bytes = per;
  EXPECT_FALSE(ErrorOf([&] { ServingCapacity(model, o, 7); }).empty());
  o.state_budget_bytes = 0;
  EXPECT_NE(ErrorOf([&] { ServingCapacity(model, o); }).find("max_running 0 needs"), std::string::npos);
}

// The stack serves as a scheduler over a pool built by hand, and its prefix
// cache reuses a shared prompt.
TEST(ServingStack, ServesAsTheHandBuiltAssemblyAndCachesSharedPrefixes) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 2, DType::kF32, 13);
  const int64_t hidden = model.geometry.hidden;
  constexpr int64_t kLen = 200;
  const ActBuffer x = RandomRows(DType::kF32, kLen, hidden, 21);
  std::vector<int32_t> ids(kLen);
  for (int64_t i = 0; i < kLen; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i % 97);
  // Request 0: the first 150 rows; request 1: all 200 (the same first 150).
  const auto serve = [&](Scheduler& sched) {
    sched.Submit({.id = 0, .input = x.view(), .length = 150, .decode_tokens = 3, .token_ids = ids.data()});
    sched.RunToCompletion();
    sched.Submit({.id = 1, .input = x.view(), .length = kLen, .decode_tokens = 5, .token_ids = ids.data()});
    sched.RunToCompletion();
    std::vector<RequestResult> r = sched.TakeFinished();
    std::sort(r.begin(), r.end(), [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
    return r;
  };
  SchedulerConfig cfg;
  cfg.prefill_chunk = 48;
  RecurrentStatePool pool(model.num_layers(), 2, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  ModelRunner runner(model, {&pool, &req}, KernelImpl::kReference);
  Scheduler by_hand(runner, cfg);
  const std::vector<RequestResult> want = serve(by_hand);

  ServingOptions o;
  o.scheduler = cfg;
  o.kernel = KernelImpl::kReference;
  ServingStack plain(model, o, 2);
  EXPECT_EQ(plain.capacity(), 2);
  EXPECT_EQ(plain.prefix_cache(), nullptr);
  const std::vector<RequestResult> got = serve(plain.scheduler());
  ASSERT_EQ(got.size(), 2U);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i].out, want[i].out);
    EXPECT_EQ(got[i].final_recurrent, want[i].final_recurrent);
    EXPECT_EQ(got[i].final_conv, want[i].final_conv);
  }
  EXPECT_EQ(plain.pool().num_free(), 2);

  o.prefix_cache_bytes = 64 << 20;
  o.scheduler.snapshot_interval = 64;
  ServingStack cached(model, o, 2);
  ASSERT_NE(cached.prefix_cache(), nullptr);
  const std::vector<RequestResult> hit = serve(cached.scheduler());
  EXPECT_EQ(hit[0].cached_tokens, 0);
  EXPECT_EQ(hit[1].cached_tokens, 150);  // the snapshot request 0 left at its end
  EXPECT_EQ(cached.scheduler().cache_hit_tokens(), 150);
  const size_t from = 150 * static_cast<size_t>(hidden);
  std::vector<float> a(want[1].out.size() / sizeof(float)), b(a.size());
  std::memcpy(a.data(), want[1].out.data(), want[1].out.size());
  std::memcpy(b.data(), hit[1].out.data(), hit[1].out.size());
  EXPECT_TRUE(AllCloseF32(b.data() + from, a.data() + from, a.size() - from));
  EXPECT_TRUE(
      AllCloseF32(hit[1].final_recurrent.data(), want[1].final_recurrent.data(), want[1].final_recurrent.size()));
}

TEST(ModelRunner, ForwardLayerRunsOneLayerOnItsOwnInput) {
  const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", SmallShape(), 2, DType::kF32, 17);
  const int64_t hidden = model.geometry.hidden;
  ServingOptions o;
  o.kernel = KernelImpl::kReference;
  ServingStack stack(model, o, 1);
  const int32_t slot = stack.req_pool().Alloc(4);
  const ActBuffer x = RandomRows(DType::kF32, 5, hidden, 8);
  ActBuffer got(DType::kF32, 5 * hidden);
  ForwardBatch b = BatchOf(stack.req_pool(), ForwardMode::kExtend, {4}, {5}, {0});
  stack.runner().ForwardLayer(1, b, x.view(), got.mut());
  // Layer 1 alone, as the backend runs it.
  RecurrentStatePool pool(2, 1, model.state_spec(), DType::kF32);
  HybridReqToTokenPool req(&pool);
  DeltaRuleAttnBackend backend({&pool, &req}, KernelImpl::kReference);
  req.Alloc(4);
  backend.InitForwardMetadata(BatchOf(req, ForwardMode::kExtend, {4}, {5}, {0}));
  ActBuffer want(DType::kF32, 5 * hidden);
  model.layers[1]->Forward(want.mut(), x.view(), backend);
  EXPECT_EQ(got.ToFloat(), want.ToFloat());
  std::vector<float> state(static_cast<size_t>(model.state_spec().recurrent_size()));
  std::vector<float> want_state(state.size());
  stack.pool().GetLayerState(1, slot, state.data(), nullptr);
  pool.GetLayerState(1, req.SlotOf(4), want_state.data(), nullptr);
  EXPECT_EQ(state, want_state);
  EXPECT_NE(ErrorOf([&] { stack.runner().ForwardLayer(2, b, x.view(), got.mut()); }).find("layer 2 of 2"),
            std::string::npos);
  b.mode = ForwardMode::kTargetVerify;
  EXPECT_NE(ErrorOf([&] { stack.runner().ForwardLayer(0, b, x.view(), got.mut()); }).find("EXTEND or DECODE"),
            std::string::npos);
}

}  // namespace kda
