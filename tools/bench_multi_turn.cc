#include "tools/bench_multi_turn.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/base/tolerance.h"
#include "kda/mem_cache/radix_state_cache.h"
#include "kda/serving/scheduler.h"
#include "kda/serving/serving_stack.h"

namespace kda::cli {
namespace {

constexpr int kVocab = 4096;

// One turn's request: the conversation so far (system prompt, earlier turns
// with their answers, this user message) and this turn's answer, decoded.
struct Turn {
  std::vector<int32_t> ids;  // [prompt + answer]
  ActBuffer rows;            // [prompt + answer, hidden]: the embedding of the ids
};

struct Chats {
  std::vector<std::vector<Turn>> turns;  // [conversation][turn]
  int64_t prompt_tokens = 0;             // every turn's prompt (answers excluded)
};

Chats MakeChats(const BenchOptions& opt, const DeltaRuleModel& model) {
  const int64_t hidden = model.geometry.hidden;
  std::mt19937_64 rng(opt.seed);
  // The embedding table: the ids determine the rows, as in a model.
  std::normal_distribution<float> normal(0.0F, 1.0F);
  ActBuffer table(model.act_dtype, kVocab * hidden);
  for (int64_t i = 0; i < kVocab * hidden; ++i) table.Set(i, normal(rng));
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::uniform_int_distribution<int64_t> user_len(opt.min_user, opt.max_user);
  const auto random_ids = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = token(rng);
    return v;
  };
  const std::vector<int32_t> system = random_ids(opt.system_prompt);
  const size_t row = static_cast<size_t>(hidden) * DTypeSize(model.act_dtype);
  Chats c;
  for (int s = 0; s < opt.conversations; ++s) {
    std::vector<int32_t> conv = system;
    c.turns.emplace_back();
    for (int r = 0; r < opt.turns; ++r) {
      const std::vector<int32_t> user = random_ids(user_len(rng));
      conv.insert(conv.end(), user.begin(), user.end());
      c.prompt_tokens += static_cast<int64_t>(conv.size());
      const std::vector<int32_t> answer = random_ids(opt.decode_steps);
      conv.insert(conv.end(), answer.begin(), answer.end());
      Turn t;
      t.ids = conv;
      t.rows = ActBuffer::Uninitialized(model.act_dtype, static_cast<int64_t>(conv.size()) * hidden);
      for (size_t i = 0; i < conv.size(); ++i) {
        std::memcpy(static_cast<uint8_t*>(t.rows.data()) + i * row,
                    static_cast<const uint8_t*>(table.data()) + static_cast<size_t>(conv[i]) * row, row);
      }
      c.turns.back().push_back(std::move(t));
    }
  }
  return c;
}

// The first layer's output rows of one request, in token order (fp32 values).
class FirstLayerTrace : public LayerObserver {
 public:
  explicit FirstLayerTrace(int64_t req_id) : req_id_(req_id) {}
  void OnBatch(const ForwardBatch& batch) override {
    at_ = RowsOf(batch, req_id_);
    tokens_ = batch.num_tokens();
  }
  void OnTensor(int layer_id, LayerTensor which, ConstBuf values, int64_t count) override {
    if (at_.rows == 0 || layer_id != 0 || which != LayerTensor::kOutput) return;
    const int64_t width = count / tokens_;
    for (int64_t i = at_.begin * width; i < (at_.begin + at_.rows) * width; ++i) {
      out_.push_back(LoadAsFloat(values.data, values.dtype, static_cast<size_t>(i)));
    }
  }
  const std::vector<float>& out() const { return out_; }

 private:
  int64_t req_id_;
  BatchRows at_;
  int64_t tokens_ = 1;
  std::vector<float> out_;
};

struct Run {
  std::map<int64_t, RequestResult> results;  // by id = conversation * turns + turn
  double prefill_s = 0.0;
  double decode_s = 0.0;
  int64_t hit_tokens = 0;
  int64_t snapshot_bytes_peak = 0;
  int64_t snapshot_capacity = 0;
};

// Serves the chats turn by turn (every conversation's turn r once each
// conversation's turn r-1 finished; the first conversation's first turn
// alone before the others, so that the system prompt is computed once).
Run Serve(const BenchOptions& opt, const DeltaRuleModel& model, const Chats& chats, KernelImpl kernel,
          int64_t cache_bytes, LayerObserver* observer = nullptr, const std::vector<int64_t>& only = {}) {
  ParallelServeOptions options = BenchServingOptions(opt, kernel);
  options.prefix_cache_bytes = cache_bytes;
  options.observer = observer;
  ServingStack stack(model, options, opt.conversations);
  Scheduler& sched = stack.scheduler();
  Run run;
  const auto submit = [&](int s, int r) {
    const int64_t id = static_cast<int64_t>(s) * opt.turns + r;
    if (!only.empty() && std::find(only.begin(), only.end(), id) == only.end()) return;
    const Turn& t = chats.turns[s][r];
    ServeRequest q;
    q.id = id;
    q.input = t.rows.view();
    q.length = static_cast<int64_t>(t.ids.size());
    q.decode_tokens = opt.decode_steps;
    q.token_ids = t.ids.data();
    sched.Submit(q);
  };
  const auto drain = [&] {
    sched.RunToCompletion();
    for (RequestResult& r : sched.TakeFinished()) run.results[r.id] = std::move(r);
  };
  for (int r = 0; r < opt.turns; ++r) {
    for (int s = 0; s < opt.conversations; ++s) {
      submit(s, r);
      if (r == 0 && s == 0) drain();
    }
    drain();
  }
  for (const StepRecord& st : sched.steps())
    (st.mode == ForwardMode::kDecode ? run.decode_s : run.prefill_s) += st.seconds;
  run.hit_tokens = sched.cache_hit_tokens();
  if (const RadixStateCache* cache = stack.prefix_cache(); cache != nullptr) {
    run.snapshot_bytes_peak = cache->peak_bytes();
    run.snapshot_capacity = cache->capacity();
  }
  return run;
}

// The computed rows [cached, length) of a result, and its final recurrent states, as float.
std::vector<float> ComputedRows(const RequestResult& r, int64_t cached, int64_t hidden, DType dt) {
  const std::vector<float> all = BytesToFloat(r.out, dt);
  return {all.begin() + cached * hidden, all.end()};
}

}  // namespace

int RunMultiTurnBench(const BenchOptions& opt, DType dtype, WeightFormat weights, KernelImpl kernel) {
  Check(opt.conversations >= 1 && opt.turns >= 1, "--conversations and --turns must be >= 1");
  Check(opt.system_prompt >= 0 && opt.min_user >= 1 && opt.max_user >= opt.min_user,
        "--system-prompt must be >= 0 and 1 <= --min-user <= --max-user");
  Check(opt.prefix_cache_mib > 0, "--prefix-cache-mib must be > 0 with --workload multi-turn");
  Check(opt.tp == 1 && opt.dp == 1,
        "--workload multi-turn runs in one process (--tp/--dp: each rank caches its own heads and requests, see "
        "kda run --prefix-cache)");
  Check(opt.model_dir.empty() || opt.layers >= 0, "--layers must be >= 0");
  const auto make_model = [&](DType act) {
    if (opt.model_dir.empty()) {
      return DeltaRuleModel::Random(opt.model_type, LayerFamilyFor(opt.model_type).reference, opt.layers, act, 20261129,
                                    nullptr, weights);
    }
    DeltaRuleModel m = DeltaRuleModel::Load(opt.model_dir, act, std::nullopt, nullptr, weights);
    if (opt.layers > 0 && opt.layers < m.num_layers()) {
      m.layers.erase(m.layers.begin() + opt.layers, m.layers.end());
      m.model_layer_ids.resize(static_cast<size_t>(opt.layers));
    }
    return m;
  };
  const DeltaRuleModel model = make_model(dtype);
  const Chats chats = MakeChats(opt, model);
  const int64_t cache_bytes = BenchServingOptions(opt, kernel).prefix_cache_bytes;
  const int64_t hidden = model.geometry.hidden;
  const int L = model.num_layers();

  std::printf(
      "kda bench --workload multi-turn: %d conversations x %d turns, system prompt %lld tokens, user "
      "messages %lld..%lld, %lld decoded tokens per answer; %d layers (hidden %lld, %d heads x %d), %s, %s "
      "weights, %d threads, kernel %s\n",
      opt.conversations, opt.turns, static_cast<long long>(opt.system_prompt), static_cast<long long>(opt.min_user),
      static_cast<long long>(opt.max_user), static_cast<long long>(opt.decode_steps), L, static_cast<long long>(hidden),
      model.geometry.H, model.geometry.K, opt.dtype.c_str(), WeightFormatName(model.weights_format), NumThreads(),
      ActiveKernelDescription(kernel));
  std::fflush(stdout);
  const int64_t probe = static_cast<int64_t>(opt.conversations) * opt.turns - 1;
  const bool bf16 = dtype == DType::kBF16;
  FirstLayerTrace off_trace(probe);
  FirstLayerTrace on_trace(probe);
  const Run off = Serve(opt, model, chats, kernel, 0, bf16 ? &off_trace : nullptr);
  const Run on = Serve(opt, model, chats, kernel, cache_bytes, bf16 ? &on_trace : nullptr);

  // Self-check: cache on vs off, each request's computed rows and final
  // recurrent states. fp32: the fp32 rules over every request and layer
  // stack. bf16: the bf16 rule (design §5), per layer as the rule is stated
  // (over a layer stack, bf16 rounding flips of earlier layers' outputs
  // cascade into the later layers' inputs), on the first layer, whose inputs
  // the two runs share: the last turn of the last conversation (reused from
  // the cache at every turn), with the fp32 pipeline's first layer, cache
  // off, as the exact output x.
  double worst = 0.0;
  bool pass = true;
  const auto note = [&](const ToleranceReport& rep) {
    worst = std::max(worst, rep.max_ratio);
    pass = pass && rep.ok;
  };
  if (dtype == DType::kF32) {
    for (const auto& [id, a] : on.results) {
      const RequestResult& r = off.results.at(id);
      const std::vector<float> ga = ComputedRows(a, a.cached_tokens, hidden, dtype);
      const std::vector<float> gr = ComputedRows(r, a.cached_tokens, hidden, dtype);
      note(CompareF32(ga.data(), gr.data(), gr.size()));
      note(CompareStateF32(a.final_recurrent.data(), r.final_recurrent.data(), r.final_recurrent.size()));
    }
  } else {
    const DeltaRuleModel exact_model = make_model(DType::kF32);
    Chats exact_chats;
    exact_chats.turns.resize(chats.turns.size());
    for (size_t s = 0; s < chats.turns.size(); ++s) {
      for (const Turn& t : chats.turns[s]) {
        Turn e;  // only the probe is served: the others stay empty
        if (static_cast<int64_t>(s * chats.turns[s].size() + exact_chats.turns[s].size()) == probe) {
          e.ids = t.ids;
          e.rows = ActBuffer::Uninitialized(DType::kF32, t.rows.size());
          for (int64_t i = 0; i < t.rows.size(); ++i) e.rows.Set(i, t.rows.Get(i));
        }
        exact_chats.turns[s].push_back(std::move(e));
      }
    }
    FirstLayerTrace exact_trace(probe);
    const Run x = Serve(opt, exact_model, exact_chats, kernel, 0, &exact_trace, {probe});
    const RequestResult& a = on.results.at(probe);
    const RequestResult& r = off.results.at(probe);
    const RequestResult& e = x.results.at(probe);
    const size_t skip = static_cast<size_t>(a.cached_tokens * hidden);
    const std::vector<float>& ga = on_trace.out();  // computed rows only
    const std::vector<float> gr(off_trace.out().begin() + static_cast<std::ptrdiff_t>(skip), off_trace.out().end());
    const std::vector<float> gx(exact_trace.out().begin() + static_cast<std::ptrdiff_t>(skip), exact_trace.out().end());
    Check(ga.size() == gr.size() && gx.size() == gr.size(), "bench: the traced request's rows differ between runs");
    const size_t rs = static_cast<size_t>(model.state_spec().recurrent_size());  // the first layer's final state
    const ToleranceReport o = CompareBF16(ga.data(), gr.data(), gx.data(), gr.size());
    const ToleranceReport st =
        CompareBF16(a.final_recurrent.data(), r.final_recurrent.data(), e.final_recurrent.data(), rs);
    note(o);
    note(st);
    std::printf(
        "  self-check (request %lld, the last turn of the last conversation, %lld of %lld rows reused; "
        "first layer): out %s; final state %s\n",
        static_cast<long long>(probe), static_cast<long long>(a.cached_tokens),
        static_cast<long long>(a.out.size() / (static_cast<size_t>(hidden) * DTypeSize(dtype))), o.Summary().c_str(),
        st.Summary().c_str());
  }

  const double hit_ratio =
      static_cast<double>(on.hit_tokens) / static_cast<double>(std::max<int64_t>(chats.prompt_tokens, 1));
  const double speedup = on.prefill_s > 0 ? off.prefill_s / on.prefill_s : 0.0;
  std::printf("  prompt tokens %lld, reused from the cache %lld (hit ratio %.3f)\n",
              static_cast<long long>(chats.prompt_tokens), static_cast<long long>(on.hit_tokens), hit_ratio);
  std::printf("  prefill: cache off %.3f s, cache on %.3f s (%.2fx); decode: %.3f s / %.3f s\n", off.prefill_s,
              on.prefill_s, speedup, off.decode_s, on.decode_s);
  std::printf("  snapshots: %lld bytes each, budget %lld (%lld snapshots), peak %lld bytes\n",
              static_cast<long long>(RadixStateCache::SnapshotBytes(L, model.state_spec(), model.act_dtype)),
              static_cast<long long>(cache_bytes), static_cast<long long>(on.snapshot_capacity),
              static_cast<long long>(on.snapshot_bytes_peak));
  std::printf("  self-check (cache on vs off, worst max_ratio): %.3g -> %s\n", worst, pass ? "PASS" : "FAIL");
  if (opt.json) {
    std::printf(
        "{\"workload\": \"multi-turn\", \"conversations\": %d, \"turns\": %d, \"layers\": %d, \"dtype\": \"%s\", "
        "\"weights\": \"%s\", \"threads\": %d, \"kernel\": \"%s\", \"prompt_tokens\": %lld, \"cache_hit_tokens\": "
        "%lld, "
        "\"cache_hit_ratio\": %.6g, \"prefill_s_cache_off\": %.6g, \"prefill_s_cache_on\": %.6g, "
        "\"prefill_speedup\": %.6g, \"snapshot_bytes_peak\": %lld, \"self_check_max_ratio\": %.6g}\n",
        opt.conversations, opt.turns, L, opt.dtype.c_str(), WeightFormatName(model.weights_format), NumThreads(),
        ActiveKernelDescription(kernel), static_cast<long long>(chats.prompt_tokens),
        static_cast<long long>(on.hit_tokens), hit_ratio, off.prefill_s, on.prefill_s, speedup,
        static_cast<long long>(on.snapshot_bytes_peak), worst);
  }
  std::fflush(stdout);
  return pass ? 0 : 1;
}

}  // namespace kda::cli
