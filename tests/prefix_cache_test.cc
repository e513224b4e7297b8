// Recurrent prefix caching: the RadixStateCache (hits, misses, partial hits,
// branching prefixes, LRU eviction with tombstones, locks, a zero budget) and
// the Scheduler serving with it (every request's result equals its uncached
// run, reused rows are not computed, nothing leaks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/radix_state_cache.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/mem_cache/recurrent_state_spec.h"
#include "kda/models/delta_rule_model.h"
#include "kda/serving/scheduler.h"
#include "tests/error_util.h"
#include "tests/family_shapes.h"
#include "tests/request_result.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseF32;
using testing::AsFloats;
using testing::ErrorOf;
using testing::SameFinalStates;

const DeltaRuleGeometry kTiny = DeltaRuleGeometry::Kda(/*hidden=*/48, /*heads=*/2, /*head_dim=*/16, /*conv_width=*/4,
                                                       /*eps=*/1e-5);
const RecurrentStateSpec kTinySpec = kTiny.state_spec();

std::vector<int32_t> Iota(int64_t n, int32_t first = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A snapshot's first value, as a marker written at Reserve.
float Marker(const RadixStateCache::Snapshot& s) { return s.recurrent[0]; }

// Reserves, marks and commits the snapshot of tokens[0, n); false when none was made.
bool Put(RadixStateCache& c, const std::vector<int32_t>& tokens, int64_t n, float marker) {
  const auto s = c.Reserve(tokens.data(), n);
  if (!s) return false;
  EXPECT_EQ(s->length, n);
  s->recurrent[0] = marker;
  c.Commit(s->id);
  return true;
}

// The matched length (0: none), unlocking the match.
int64_t MatchLength(RadixStateCache& c, const std::vector<int32_t>& tokens, int64_t n, float* marker = nullptr) {
  const auto s = c.Match(tokens.data(), n);
  if (!s) return 0;
  if (marker != nullptr) *marker = Marker(*s);
  c.Unlock(s->id);
  return s->length;
}

int64_t Budget(int snapshots) { return snapshots * RadixStateCache::SnapshotBytes(2, kTinySpec, DType::kF32); }

// ------------------------------------------------------------ the cache alone

TEST(RadixStateCache, HitMissAndPartialHit) {
  RadixStateCache c(2, kTinySpec, DType::kF32, Budget(8));
  EXPECT_EQ(c.capacity(), 8);
  const std::vector<int32_t> a = Iota(300);
  EXPECT_EQ(MatchLength(c, a, 300), 0);  // empty cache: miss
  ASSERT_TRUE(Put(c, a, 64, 1.0F));
  ASSERT_TRUE(Put(c, a, 128, 2.0F));
  EXPECT_FALSE(Put(c, a, 128, 9.0F));  // already held
  float m = 0.0F;
  EXPECT_EQ(MatchLength(c, a, 300, &m), 128);  // the deepest
  EXPECT_EQ(m, 2.0F);
  EXPECT_EQ(MatchLength(c, a, 128, &m), 128);  // the whole request
  EXPECT_EQ(MatchLength(c, a, 127, &m), 64);   // a prefix shorter than the deeper snapshot
  EXPECT_EQ(m, 1.0F);
  std::vector<int32_t> b = a;
  b[100] = -5;  // diverges between the two snapshots: partial hit
  EXPECT_EQ(MatchLength(c, b, 300, &m), 64);
  EXPECT_EQ(m, 1.0F);
  b[0] = -5;  // diverges at the first token: miss
  EXPECT_EQ(MatchLength(c, b, 300), 0);
  EXPECT_EQ(MatchLength(c, a, 63), 0);
  EXPECT_EQ(c.num_snapshots(), 2);
  EXPECT_EQ(c.num_locked(), 0);
}

TEST(RadixStateCache, BranchingConversationsShareTheirCommonSnapshots) {
  // Two prompts diverging at token 700: the second reuses the 512 snapshot of the first.
  RadixStateCache c(2, kTinySpec, DType::kF32, Budget(16));
  const std::vector<int32_t> a = Iota(1000);
  std::vector<int32_t> b = a;
  for (size_t i = 700; i < b.size(); ++i) b[i] = static_cast<int32_t>(5000 + i);
  for (int64_t p : {256, 512, 768, 1000}) ASSERT_TRUE(Put(c, a, p, static_cast<float>(p)));
  float m = 0.0F;
  EXPECT_EQ(MatchLength(c, b, 1000, &m), 512);
  EXPECT_EQ(m, 512.0F);
  for (int64_t p : {768, 900}) ASSERT_TRUE(Put(c, b, p, static_cast<float>(-p)));
  EXPECT_EQ(MatchLength(c, b, 1000, &m), 900);
  EXPECT_EQ(m, -900.0F);
  EXPECT_EQ(MatchLength(c, a, 1000, &m), 1000);
  EXPECT_EQ(m, 1000.0F);
  // Edge split at 700: root, 256, 512, 700 (branch), a's 768 and 1000, b's 768 and 900.
  EXPECT_EQ(c.num_nodes(), 8);
  EXPECT_TRUE(c.Contains(a.data(), 512));
  EXPECT_FALSE(c.Contains(a.data(), 700));
}

TEST(RadixStateCache, EvictsLeastRecentlyUsedAndKeepsTombstones) {
  RadixStateCache c(2, kTinySpec, DType::kF32, Budget(2));
  const std::vector<int32_t> a = Iota(1000);
  ASSERT_TRUE(Put(c, a, 256, 1.0F));
  ASSERT_TRUE(Put(c, a, 512, 2.0F));
  EXPECT_EQ(MatchLength(c, a, 300), 256);  // 256 used last
  ASSERT_TRUE(Put(c, a, 768, 3.0F));       // evicts 512, the least recently used
  EXPECT_EQ(c.evictions(), 1);
  EXPECT_EQ(c.num_snapshots(), 2);
  EXPECT_FALSE(c.Contains(a.data(), 512));
  EXPECT_TRUE(c.Contains(a.data(), 256));  // (Contains does not count as a use)
  ASSERT_TRUE(Put(c, a, 900, 4.0F));       // evicts 256 (768 is newer): a tombstone above 768 and 900
  EXPECT_FALSE(c.Contains(a.data(), 256));
  float m = 0.0F;
  EXPECT_EQ(MatchLength(c, a, 1000, &m), 900);  // deeper snapshots stay reachable through tombstones
  EXPECT_EQ(m, 4.0F);
  EXPECT_EQ(MatchLength(c, a, 800, &m), 768);
  EXPECT_EQ(MatchLength(c, a, 700), 0);
  // root, 256 (a tombstone above 768), 768, 900; 512's node went when evicted (then a leaf).
  EXPECT_EQ(c.num_nodes(), 4);
  // A tombstone leaf is removed: evicting 900 (now the LRU) drops its node.
  EXPECT_EQ(MatchLength(c, a, 800), 768);
  std::vector<int32_t> b = Iota(100, 7000);
  ASSERT_TRUE(Put(c, b, 64, 5.0F));
  EXPECT_FALSE(c.Contains(a.data(), 900));
  EXPECT_EQ(c.num_nodes(), 4);  // 900 gone, b's 64 added
  EXPECT_EQ(c.peak_bytes(), Budget(2));
}

TEST(RadixStateCache, LockedSnapshotsAreNeverEvictedNorReservedOnesVisible) {
  RadixStateCache c(2, kTinySpec, DType::kF32, Budget(1));
  const std::vector<int32_t> a = Iota(300);
  const std::vector<int32_t> b = Iota(300, 1000);
  ASSERT_TRUE(Put(c, a, 256, 1.0F));
  const auto held = c.Match(a.data(), 300);  // a request copying it
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(c.num_locked(), 1);
  EXPECT_FALSE(c.Reserve(b.data(), 256).has_value());  // no room: the only snapshot is locked
  c.Unlock(held->id);
  EXPECT_NE(ErrorOf([&] { c.Unlock(held->id); }).find("not locked"), std::string::npos);
  // A reserved snapshot is locked and invisible until committed; abandoned, it is gone.
  const auto r = c.Reserve(b.data(), 256);  // evicts a's
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(MatchLength(c, b, 300), 0);
  EXPECT_FALSE(c.Reserve(a.data(), 256).has_value());  // the reserved one is locked
  c.Abandon(r->id);
  EXPECT_EQ(c.num_snapshots(), 0);
  EXPECT_EQ(c.num_nodes(), 1);  // only the root: tombstone leaves removed
  EXPECT_TRUE(Put(c, b, 256, 2.0F));
  EXPECT_EQ(MatchLength(c, b, 300), 256);
}

TEST(RadixStateCache, ZeroBudgetCachesNothing) {
  for (int64_t budget : {int64_t{0}, Budget(1) - 1}) {
    RadixStateCache c(2, kTinySpec, DType::kF32, budget);
    const std::vector<int32_t> a = Iota(300);
    EXPECT_FALSE(c.enabled());
    EXPECT_FALSE(c.Reserve(a.data(), 256).has_value());
    EXPECT_FALSE(c.Match(a.data(), 300).has_value());
    EXPECT_EQ(c.num_nodes(), 1);
  }
  EXPECT_NE(ErrorOf([] { RadixStateCache(2, kTinySpec, DType::kF32, -1); }).find("budget"), std::string::npos);
}

// ------------------------------------------------------------ the scheduler

// Input rows that the token ids determine (an embedding table), as in a model.
class Embedding {
 public:
  Embedding(int vocab, int64_t hidden, DType dt) : hidden_(hidden), dt_(dt), table_(dt, vocab * hidden) {
    std::mt19937_64 rng(77);
    std::normal_distribution<float> normal(0.0F, 1.0F);
    for (int64_t i = 0; i < vocab * hidden; ++i) table_.Set(i, normal(rng));
  }
  ActBuffer Rows(const std::vector<int32_t>& ids) const {
    ActBuffer b(dt_, static_cast<int64_t>(ids.size()) * hidden_);
    const size_t row = static_cast<size_t>(hidden_) * DTypeSize(dt_);
    for (size_t t = 0; t < ids.size(); ++t) {
      std::memcpy(static_cast<uint8_t*>(b.data()) + t * row,
                  static_cast<const uint8_t*>(table_.data()) + static_cast<size_t>(ids[t]) * row, row);
    }
    return b;
  }

 private:
  int64_t hidden_;
  DType dt_;
  ActBuffer table_;
};

struct Req {
  std::vector<int32_t> ids;
  int64_t decode = 0;
  ActBuffer rows;
};

// Serves reqs one at a time (in order, each after the previous finished, as
// conversation turns do) or all at once, with or without a cache.
class Server {
 public:
  Server(const DeltaRuleModel& model, int64_t slots, RadixStateCache* cache, SchedulerConfig cfg = {})
      : pool_(model.num_layers(), slots, model.state_spec(), model.act_dtype),
        req_(&pool_),
        runner_(model, {&pool_, &req_}) {
    cfg.prefix_cache = cache;
    sched_ = std::make_unique<Scheduler>(runner_, cfg);
  }
  void Submit(int64_t id, const Req& r, bool with_ids = true) {
    ServeRequest s;
    s.id = id;
    s.input = r.rows.view();
    s.length = static_cast<int64_t>(r.ids.size());
    s.decode_tokens = r.decode;
    s.token_ids = with_ids ? r.ids.data() : nullptr;
    sched_->Submit(s);
  }
  // Submits the request and runs the scheduler until every request is done.
  void Serve(int64_t id, const Req& r, bool with_ids = true) {
    Submit(id, r, with_ids);
    sched_->RunToCompletion();
  }
  // Serves `first` (id 1), then `second` (id 2): the second's result.
  RequestResult ServeAfter(const Req& first, const Req& second, bool with_ids = true) {
    Serve(1, first, with_ids);
    Serve(2, second, with_ids);
    return Results().at(2);
  }
  std::map<int64_t, RequestResult> Results() {
    std::map<int64_t, RequestResult> m;
    for (RequestResult& r : sched_->TakeFinished()) m[r.id] = std::move(r);
    return m;
  }
  Scheduler& sched() { return *sched_; }
  RecurrentStatePool& pool() { return pool_; }

 private:
  RecurrentStatePool pool_;
  HybridReqToTokenPool req_;
  ModelRunner runner_;
  std::unique_ptr<Scheduler> sched_;
};

// got (served with the cache) against want (its uncached run): rows
// [cached, length) within the fp32 tolerance, rows [0, cached) zeros, final
// states within the state rule.
::testing::AssertionResult SameResult(const RequestResult& got, const RequestResult& want, int64_t hidden) {
  if (got.out.size() != want.out.size()) return ::testing::AssertionFailure() << "output sizes differ";
  const std::vector<float> g = AsFloats(got.out);
  const std::vector<float> w = AsFloats(want.out);
  const auto cached = static_cast<size_t>(got.cached_tokens * hidden);
  for (size_t i = 0; i < cached; ++i) {
    if (g[i] != 0.0F) return ::testing::AssertionFailure() << "reused row element " << i << " is not zero";
  }
  auto r = AllCloseF32(g.data() + cached, w.data() + cached, g.size() - cached);
  if (!r) return r << " (computed outputs)";
  return SameFinalStates(got, want, false);
}

// A tiny layer of each family: KDA, and Gated DeltaNet with GVA 2 and K != V.
DeltaRuleGeometry TinyOf(const std::string& model_type) {
  if (testing::IsKdaFamily(model_type)) return testing::FamilyGeometry(model_type, kTiny);
  return testing::FamilyGeometry(model_type,
                                 DeltaRuleGeometry::Gdn(kTiny.hidden, /*key_heads=*/2, /*value_heads=*/4,
                                                        /*head_k_dim=*/16, /*head_v_dim=*/8, /*conv_width=*/4,
                                                        /*eps=*/1e-6));
}

class PrefixServing : public ::testing::TestWithParam<std::string> {
 protected:
  PrefixServing()
      : model_(DeltaRuleModel::Random(GetParam(), TinyOf(GetParam()), 2, DType::kF32, 21)),
        emb_(64, kTiny.hidden, DType::kF32) {}

  Req Make(std::vector<int32_t> ids, int64_t decode = 0) const {
    Req r;
    r.ids = std::move(ids);
    r.decode = decode;
    r.rows = emb_.Rows(r.ids);
    return r;
  }
  std::vector<int32_t> RandomIds(int64_t n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& x : v) x = static_cast<int32_t>(rng() % 64);
    return v;
  }
  // Each request alone, without a cache.
  RequestResult Uncached(const Req& r) const {
    Server s(model_, 1, nullptr);
    s.Serve(0, r, false);
    return s.Results().at(0);
  }

  // Bytes of `snapshots` snapshots of the model's two layers.
  int64_t ModelBudget(int snapshots) const {
    return snapshots * RadixStateCache::SnapshotBytes(2, model_.state_spec(), DType::kF32);
  }

  DeltaRuleModel model_;
  Embedding emb_;
};

TEST_P(PrefixServing, HitsPartialHitsAndWholeRequestHitsMatchUncachedRuns) {
  RadixStateCache cache(2, model_.state_spec(), DType::kF32, ModelBudget(64));
  SchedulerConfig cfg;
  cfg.snapshot_interval = 64;
  Server s(model_, 4, &cache, cfg);
  const std::vector<int32_t> base = RandomIds(300, 1);
  std::vector<int32_t> partial(base.begin(), base.begin() + 200);
  const std::vector<int32_t> extra = RandomIds(150, 2);
  partial.insert(partial.end(), extra.begin(), extra.end());
  std::vector<Req> reqs;
  reqs.push_back(Make(base));
  reqs.push_back(Make(partial, 5));
  reqs.push_back(Make(base));
  reqs.push_back(Make(RandomIds(90, 3)));
  const std::vector<int64_t> want_cached = {0, 192, 300, 0};
  for (size_t i = 0; i < reqs.size(); ++i) {
    s.Serve(static_cast<int64_t>(i), reqs[i]);
  }
  std::map<int64_t, RequestResult> got = s.Results();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got[static_cast<int64_t>(i)].cached_tokens, want_cached[i]);
    EXPECT_TRUE(SameResult(got[static_cast<int64_t>(i)], Uncached(reqs[i]), kTiny.hidden));
  }
  EXPECT_EQ(s.sched().cache_hit_tokens(), 492);
  // Snapshots: base at 64..256 and 300; partial at 64..320 past the hit, its prompt end 345 and its end 350.
  EXPECT_TRUE(cache.Contains(base.data(), 300));
  EXPECT_TRUE(cache.Contains(partial.data(), 320));
  EXPECT_TRUE(cache.Contains(partial.data(), 345));
  EXPECT_TRUE(cache.Contains(partial.data(), 350));
  EXPECT_EQ(cache.num_locked(), 0);
  EXPECT_EQ(s.pool().num_free(), 4);
}

TEST_P(PrefixServing, BranchingConversationReusesTheCommonSnapshot) {
  // Two prompts diverging at token 700 (interval 256): the second starts from 512.
  RadixStateCache cache(2, model_.state_spec(), DType::kF32, ModelBudget(64));
  Server s(model_, 2, &cache);
  std::vector<int32_t> a = RandomIds(900, 4);
  std::vector<int32_t> b = a;
  const std::vector<int32_t> tail = RandomIds(200, 5);
  std::copy(tail.begin(), tail.end(), b.begin() + 700);
  ASSERT_NE(a[700], b[700]);
  const Req ra = Make(a);
  const Req rb = Make(b);
  const RequestResult got = s.ServeAfter(ra, rb);
  EXPECT_EQ(got.cached_tokens, 512);
  EXPECT_TRUE(SameResult(got, Uncached(rb), kTiny.hidden));
}

TEST_P(PrefixServing, NextTurnReusesThePreviousTurnWithItsDecodedTokens) {
  RadixStateCache cache(2, model_.state_spec(), DType::kF32, ModelBudget(64));
  SchedulerConfig cfg;
  cfg.prefill_chunk = 100;  // segments not aligned to the snapshot points
  Server s(model_, 2, &cache, cfg);
  std::vector<int32_t> conv = RandomIds(333, 6);
  std::vector<Req> turns;
  for (int turn = 0; turn < 3; ++turn) {
    const std::vector<int32_t> user = RandomIds(70 + 13 * turn, 10 + turn);
    if (turn > 0) conv.insert(conv.end(), user.begin(), user.end());
    std::vector<int32_t> with_answer = conv;
    const std::vector<int32_t> answer = RandomIds(32, 20 + turn);
    with_answer.insert(with_answer.end(), answer.begin(), answer.end());
    turns.push_back(Make(with_answer, 32));  // the answer's 32 tokens are decoded
    conv = with_answer;
    s.Serve(turn, turns.back());
  }
  std::map<int64_t, RequestResult> got = s.Results();
  EXPECT_EQ(got[0].cached_tokens, 0);
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    if (turn > 0) {
      EXPECT_EQ(got[turn].cached_tokens, static_cast<int64_t>(turns[turn - 1].ids.size()));
    }
    EXPECT_TRUE(SameResult(got[turn], Uncached(turns[turn]), kTiny.hidden));
  }
}

TEST_P(PrefixServing, RequestsWithoutIdsAndAZeroBudgetAreNeverCached) {
  const Req r = Make(RandomIds(300, 7));
  const RequestResult want = Uncached(r);
  {
    RadixStateCache cache(2, model_.state_spec(), DType::kF32, ModelBudget(64));
    Server s(model_, 2, &cache);
    const RequestResult got = s.ServeAfter(r, r, false);
    EXPECT_EQ(got.cached_tokens, 0);
    EXPECT_TRUE(SameResult(got, want, kTiny.hidden));
    EXPECT_EQ(cache.num_snapshots(), 0);
  }
  {
    RadixStateCache cache(2, model_.state_spec(), DType::kF32, 0);
    Server s(model_, 2, &cache);
    const RequestResult got = s.ServeAfter(r, r);
    EXPECT_EQ(got.cached_tokens, 0);
    EXPECT_TRUE(SameResult(got, want, kTiny.hidden));
    EXPECT_NE(s.sched().notes().back().find("off"), std::string::npos);
  }
}

TEST_P(PrefixServing, BadIntervalAndAMismatchedCacheAreRefused) {
  RadixStateCache cache(2, model_.state_spec(), DType::kF32, ModelBudget(4));
  SchedulerConfig cfg;
  cfg.snapshot_interval = 100;
  EXPECT_NE(ErrorOf([&] { Server s(model_, 2, &cache, cfg); }).find("snapshot_interval"), std::string::npos);
  RadixStateCache other(3, model_.state_spec(), DType::kF32, ModelBudget(4));
  EXPECT_NE(ErrorOf([&] { Server s(model_, 2, &other); }).find("prefix cache"), std::string::npos);
}

TEST_P(PrefixServing, ThousandRequestChurnWithRandomSharedPrefixes) {
  // 1000 requests over a few shared prefixes with random tails, chunked
  // prefill, decodes, a small budget (evictions) and 6 slots: every result
  // equals its uncached run; no slot, lock or snapshot leaks.
  constexpr int kRequests = 1000;
  std::mt19937 rng(99);
  std::vector<std::vector<int32_t>> prefixes;
  prefixes.reserve(6);
  for (int i = 0; i < 6; ++i) prefixes.push_back(RandomIds(64 + 40 * i, 300 + i));
  std::vector<Req> reqs;
  for (int i = 0; i < kRequests; ++i) {
    const std::vector<int32_t>& p = prefixes[rng() % prefixes.size()];
    std::vector<int32_t> ids(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(rng() % (p.size() + 1)));
    const std::vector<int32_t> tail = RandomIds(static_cast<int64_t>(rng() % 90), 5000 + i);
    ids.insert(ids.end(), tail.begin(), tail.end());
    reqs.push_back(Make(ids, static_cast<int64_t>(rng() % 4)));
  }
  RadixStateCache cache(2, model_.state_spec(), DType::kF32, ModelBudget(32));
  SchedulerConfig cfg;
  cfg.snapshot_interval = 64;
  cfg.prefill_chunk = 45;
  cfg.step_token_budget = 120;
  Server cached(model_, 6, &cache, cfg);
  Server plain(model_, 6, nullptr, cfg);
  for (int i = 0; i < kRequests; ++i) {
    cached.Submit(i, reqs[i]);
    plain.Submit(i, reqs[i]);
    if (i % 10 == 9) {  // waves of 10
      cached.sched().RunToCompletion();
      plain.sched().RunToCompletion();
    }
  }
  std::map<int64_t, RequestResult> got = cached.Results();
  std::map<int64_t, RequestResult> want = plain.Results();
  ASSERT_EQ(got.size(), static_cast<size_t>(kRequests));
  int64_t hits = 0;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(SameResult(got[i], want[i], kTiny.hidden)) << "request " << i;
    hits += got[i].cached_tokens > 0 ? 1 : 0;
  }
  EXPECT_GT(hits, 300);  // 361 of the 1000 start from a snapshot (about 640 have a shared prefix of >= 64 tokens)
  EXPECT_GT(cache.evictions(), 0);
  EXPECT_EQ(cached.pool().num_free(), 6);
  EXPECT_EQ(cache.num_locked(), 0);
  EXPECT_LE(cache.num_snapshots(), cache.capacity());
  EXPECT_LE(cache.peak_bytes(), ModelBudget(32));
}

// Every layer family, with its variant settings.
INSTANTIATE_TEST_SUITE_P(Family, PrefixServing,
                         ::testing::Values("kimi_linear", "glm5_next", "bailing_hybrid", "qwen3_next", "qwen3_5_text",
                                           "qwen4_exp", "olmo_hybrid", "lara_mini", "granitemoehybrid", "nemotron_h",
                                           "falcon_h1", "zamba2"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kda
