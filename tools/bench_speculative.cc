#include "tools/bench_speculative.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/base/tolerance.h"
#include "kda/bench/cache.h"
#include "kda/bench/timing.h"
#include "kda/kernels/q8.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"
#include "kda/serving/scheduler.h"
#include "kda/serving/seeded_drafts.h"
#include "kda/serving/serving_stack.h"
#include "tools/layer_replay.h"

namespace kda::cli {
namespace {

template <class T>
std::vector<T> ParseList(const std::string& s, const char* flag) {
  std::vector<T> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::stringstream one(item);
    T x{};
    one >> x;
    Check(!one.fail() && one.eof(), std::string("--") + flag + ": bad item '" + item + "' in '" + s + "'");
    v.push_back(x);
  }
  Check(!v.empty(), std::string("--") + flag + " is empty");
  return v;
}

// One serving run's decode phase (the prefill steps are not counted).
struct Run {
  std::vector<RequestResult> results;  // by id
  // Steps holding the whole batch (as requests finish, batches shrink; a
  // request's last row is a plain DECODE step): their seconds.
  std::vector<double> full_decode_s;
  std::vector<double> full_verify_s;
  double decode_s = 0.0;       // every decode-phase step
  int64_t committed = 0;       // positions kept in those steps
  int64_t verify_steps = 0;    // TARGET_VERIFY steps
  int64_t accepted = 0;        // drafts accepted in them
  int64_t verify_members = 0;  // requests in them
};

// Serves the batch (drafts of k rows with acceptance alpha; k = 0: plain
// decode); `trace` (optional) follows request 0's kept positions.
Run Serve(const DeltaRuleModel& model, KernelImpl kernel, const std::vector<ActBuffer>& inputs, int64_t prompt,
          int64_t decode, const VerifyConfig& verify, int64_t k, double alpha, uint64_t seed,
          RequestTrace* trace = nullptr) {
  const auto batch = static_cast<int64_t>(inputs.size());
  ServingOptions options;
  options.scheduler.step_token_budget = 1 << 20;
  options.verify = verify;
  options.kernel = kernel;
  options.observer = trace;
  ServingStack stack(model, options, batch);
  Scheduler& sched = stack.scheduler();
  for (int64_t i = 0; i < batch; ++i) {
    ServeRequest r{.id = i, .input = inputs[i].view(), .length = prompt + decode, .decode_tokens = decode};
    if (k > 0) r.draft = SeededDraftSource(r.input, model.geometry.hidden, k, alpha, seed + static_cast<uint64_t>(i));
    if (k > 0 && trace != nullptr && i == trace->req_id()) {
      r.draft.accept = [inner = r.draft.accept, trace](int64_t committed, int64_t n, const void* out) {
        const int64_t a = inner(committed, n, out);
        trace->KeepFirst(a + 1);  // the trace holds the kept positions only
        return a;
      };
    }
    sched.Submit(r);
  }
  sched.RunToCompletion();
  Run run;
  for (const StepRecord& s : sched.steps()) {
    if (s.mode == ForwardMode::kExtend) continue;
    run.decode_s += s.seconds;
    run.committed += s.kept;
    if (s.batch_size == batch) {
      (s.mode == ForwardMode::kTargetVerify ? run.full_verify_s : run.full_decode_s).push_back(s.seconds);
    }
    if (s.mode == ForwardMode::kTargetVerify) {
      ++run.verify_steps;
      run.accepted += s.kept - s.batch_size;
      run.verify_members += s.batch_size;
    }
  }
  run.results = sched.TakeFinished();
  std::sort(run.results.begin(), run.results.end(),
            [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
  return run;
}

}  // namespace

int RunSpeculativeBench(const BenchOptions& opt, DType dtype, KernelImpl kernel) {
  const std::vector<int64_t> batches = ParseList<int64_t>(opt.spec_batches, "batches");
  const std::vector<std::string> weights = ParseList<std::string>(opt.spec_weights, "weights-list");
  const std::vector<int64_t> ks = ParseList<int64_t>(opt.spec_k, "k");
  const std::vector<double> alphas = ParseList<double>(opt.spec_alphas, "alphas");
  for (int64_t b : batches) Check(b >= 1, "--batches: batch sizes must be >= 1");
  for (int64_t k : ks) Check(k >= 1 && k <= 64, "--k: draft counts must be in [1, 64]");
  for (double a : alphas) Check(a >= 0.0 && a <= 1.0, "--alphas: probabilities must be in [0, 1]");
  Check(opt.spec_prompt >= 0 && opt.decode_steps >= 2, "--spec-prompt must be >= 0 and --decode-steps >= 2");
  Check(opt.model_dir.empty(), "--workload speculative runs the embedded default shapes (no --model)");
  Check(opt.tp == 1 && opt.dp == 1, "--workload speculative runs in one process (no --tp/--dp)");
  const VerifyMethod method = ParseVerifyMethod(opt.verify_method);
  const int64_t max_k = *std::max_element(ks.begin(), ks.end());
  const DeltaRuleGeometry shape = LayerFamilyFor("kimi_linear").reference;
  const int64_t llc = bench::LastLevelCacheBytes();
  const int64_t hidden = shape.hidden;
  const int64_t rows = opt.spec_prompt + opt.decode_steps;
  bool pass = true;
  std::printf("kda bench --workload speculative: hidden %lld, %d heads x %d, %s activations, %d threads, kernels %s\n",
              static_cast<long long>(hidden), shape.H, shape.K, DTypeName(dtype), NumThreads(),
              ActiveKernelDescription(kernel));
  std::printf("requests: %lld prompt rows (prefill, not timed) + %lld decode rows; seeded drafts; verify method %s\n",
              static_cast<long long>(opt.spec_prompt), static_cast<long long>(opt.decode_steps),
              VerifyMethodName(method));
  for (const std::string& wname : weights) {
    const WeightFormat wf = ParseWeightFormat(wname);
    // Enough layers that a step streams more projection weights than the
    // last-level cache (the decode benchmarks' DecodeStreamBytes: twice the cache, at least 256 MiB).
    int layers = opt.layers;
    const int64_t per_layer = DeltaRuleModel::Random("kimi_linear", shape, 1, dtype, 20261129, nullptr, wf)
                                  .layers[0]
                                  ->projection_weight_bytes();
    if (layers <= 0) {
      layers = static_cast<int>(bench::DecodeStreamBytes() / per_layer) + 1;
    }
    const DeltaRuleModel model = DeltaRuleModel::Random("kimi_linear", shape, layers, dtype, 20261129, nullptr, wf);
    std::optional<DeltaRuleModel> exact;  // the self-check's exact pipeline of a bf16 run
    if (dtype == DType::kBF16)
      exact = DeltaRuleModel::Random("kimi_linear", shape, layers, DType::kF32, 20261129, nullptr, wf);
    const VerifyConfig verify{.max_draft_tokens = max_k, .method = method};
    const int64_t state = RecurrentStatePool::BytesPerRequest(layers, shape.state_spec(), dtype);
    const int64_t area = RecurrentStatePool::VerifyBytesPerRequest(layers, shape.state_spec(), dtype, verify);
    std::printf(
        "\nweights %s: %d layers x %.1f MB = %.0f MB streamed per step (last-level cache %.0f MiB); state %.2f MiB "
        "per request, verify area (k <= %lld) %.2f MiB per request\n",
        WeightFormatName(wf), layers, static_cast<double>(per_layer) / 1e6,
        static_cast<double>(per_layer) * layers / 1e6, static_cast<double>(llc) / (1 << 20),
        static_cast<double>(state) / (1 << 20), static_cast<long long>(max_k), static_cast<double>(area) / (1 << 20));
    std::printf("  %5s %3s %5s %9s %10s %10s %8s %12s %12s %7s %10s\n", "batch", "k", "alpha", "mean a", "verify ms",
                "decode ms", "ratio", "commit tok/s", "decode tok/s", "speed", "check");
    for (int64_t batch : batches) {
      std::mt19937_64 rng(opt.seed + static_cast<uint64_t>(batch));
      std::normal_distribution<float> normal(0.0F, 1.0F);
      std::vector<ActBuffer> in_rows;
      for (int64_t i = 0; i < batch; ++i) {
        in_rows.emplace_back(dtype, rows * hidden);
        for (int64_t j = 0; j < rows * hidden; ++j) in_rows.back().Set(j, normal(rng));
      }
      const Run plain = Serve(model, kernel, in_rows, opt.spec_prompt, opt.decode_steps, {}, 0, 0.0, 0);
      const double decode_ms = bench::Median(plain.full_decode_s) * 1e3;
      const double decode_tps = static_cast<double>(plain.committed) / plain.decode_s;
      for (int64_t k : ks) {
        for (double alpha : alphas) {
          RequestTrace trace(0, model.num_layers());
          const Run spec = Serve(model, kernel, in_rows, opt.spec_prompt, opt.decode_steps, verify, k, alpha,
                                 opt.seed * 7919, &trace);
          // Self-check: request 0's kept positions, each layer alone on the inputs it saw, the prompt
          // in one EXTEND step and then one DECODE step per row (token-by-token decode).
          const SelfCheck check =
              ReplayCheck(model, exact ? &*exact : nullptr, trace, spec.results.at(0), kernel, opt.spec_prompt);
          const double ratio = std::max(check.out.max_ratio, check.state.max_ratio);
          const bool ok = check.pass;
          pass = pass && ok;
          const double mean_a = spec.verify_members > 0
                                    ? static_cast<double>(spec.accepted) / static_cast<double>(spec.verify_members)
                                    : 0.0;
          const double verify_ms = bench::Median(spec.full_verify_s) * 1e3;
          const double commit_tps = static_cast<double>(spec.committed) / spec.decode_s;
          std::printf("  %5lld %3lld %5.2f %9.3f %10.2f %10.2f %7.2fx %12.1f %12.1f %6.2fx %10.3g%s\n",
                      static_cast<long long>(batch), static_cast<long long>(k), alpha, mean_a, verify_ms, decode_ms,
                      verify_ms / decode_ms, commit_tps, decode_tps, commit_tps / decode_tps, ratio, ok ? "" : " FAIL");
          if (opt.json) {
            std::printf(
                "{\"batch\": %lld, \"weights\": \"%s\", \"k\": %lld, \"alpha\": %.3g, \"accepted_per_step\": %.6g, "
                "\"verify_step_ms\": %.6g, \"decode_step_ms\": %.6g, \"committed_tokens_per_s\": %.6g, "
                "\"decode_tokens_per_s\": %.6g, \"self_check_max_ratio\": %.6g}\n",
                static_cast<long long>(batch), WeightFormatName(wf), static_cast<long long>(k), alpha, mean_a,
                verify_ms, decode_ms, commit_tps, decode_tps, ratio);
          }
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("\nself-check (committed states vs token-by-token decode): %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace kda::cli
