#include "tools/bench_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/base/tolerance.h"
#include "kda/bench/layer_problem.h"
#include "kda/bench/timing.h"
#include "kda/distributed/parallel_groups.h"
#include "kda/kernels/gemm_route.h"
#include "kda/kernels/q8.h"
#include "kda/serving/parallel.h"
#include "kda/serving/scheduler.h"
#include "tools/bench_multi_turn.h"
#include "tools/bench_speculative.h"
#include "tools/layer_replay.h"
#include "tools/rank_errors.h"

namespace kda::cli {
namespace {

// Prompt lengths spaced geometrically from min to max.
std::vector<int64_t> PromptLengths(int n, int64_t lo, int64_t hi) {
  std::vector<int64_t> lens;
  for (int i = 0; i < n; ++i) {
    const double f = n == 1 ? 1.0 : static_cast<double>(i) / (n - 1);
    lens.push_back(static_cast<int64_t>(std::llround(static_cast<double>(lo) * std::pow(double(hi) / lo, f))));
  }
  return lens;
}

struct Workload {
  std::vector<ActBuffer> inputs;  // per request [prompt + decode, hidden]
  std::vector<int64_t> prompts;
  int64_t decode_steps = 0;  // rows after each prompt
};

Workload MakeWorkload(const BenchOptions& opt, const DeltaRuleModel& model) {
  Workload w;
  w.prompts = PromptLengths(opt.requests, opt.min_prompt, opt.max_prompt);
  w.decode_steps = opt.decode_steps;
  std::mt19937_64 rng(opt.seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  for (int64_t p : w.prompts) {
    const int64_t rows = p + opt.decode_steps;
    ActBuffer b(model.act_dtype, rows * model.geometry.hidden);
    for (int64_t i = 0; i < rows * model.geometry.hidden; ++i) b.Set(i, normal(rng));
    w.inputs.push_back(std::move(b));
  }
  return w;
}

// One rank's numbers, gathered at world rank 0 (plain data: sent as bytes).
struct RankStats {
  int32_t tp_rank = 0;
  int32_t dp_rank = 0;
  int32_t heads_begin = 0;
  int32_t heads_count = 0;
  int32_t requests = 0;
  int32_t check_pass = 1;
  int64_t running = 0;  // pool slots
  int64_t state_bytes_per_request = 0;
  int64_t extend_tokens = 0;
  int64_t decode_tokens = 0;
  double extend_s = 0.0;
  double decode_s = 0.0;
  double allreduce_s = 0.0;
  double check_max_ratio = 0.0;
};

// One layer's one-shot prefill of one sequence of t tokens (bf16 weights,
// random values): the median of three timed forwards after a warm-up, in
// microseconds per token; the served prefill's per-layer rate is compared
// with it.
double OneShotLayerUsPerToken(const std::string& model_type, const DeltaRuleGeometry& geometry, DType dtype,
                              KernelImpl kernel, int64_t t) {
  bench::LayerProblem p(model_type, dtype, kernel, geometry, 1, t);
  p.Forward();  // warm-up: GEMM primitives, scratch, first touches
  return bench::MedianSeconds(3, [&] { p.Forward(); }) * 1e6 / static_cast<double>(t);
}

// World rank 0's report: the step table (its own steps), the job's
// throughput, state bytes, the per-rank table under mpirun, the self-check
// and the JSON line. Returns the exit status.
int PrintReport(const BenchOptions& opt, const DeltaRuleModel& model, KernelImpl kernel,
                const ParallelServeResult& served,
                const std::map<std::pair<int, int64_t>, std::pair<int64_t, double>>& by_batch, const SelfCheck& check,
                int64_t per_request, int probe, const std::vector<RankStats>& ranks, const ParallelGroups& groups,
                double one_shot_us) {
  const int L = model.num_layers();
  const DeltaRuleGeometry full = model.full_geometry();
  const bool multi = groups.world().size() > 1;
  // The job: every data-parallel index's tokens (counted at its tp rank 0)
  // over the slowest index's time; one process: its own numbers.
  int64_t extend_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t running = 0;
  double extend_s = 0.0;
  double decode_s = 0.0;
  double worst_ratio = 0.0;
  double worst_share = 0.0;
  int64_t rank_per_request = 0;
  bool pass = true;
  for (const RankStats& r : ranks) {
    if (r.tp_rank == 0) {
      extend_tokens += r.extend_tokens;
      decode_tokens += r.decode_tokens;
      running += r.running;
      extend_s = std::max(extend_s, r.extend_s);
      decode_s = std::max(decode_s, r.decode_s);
    }
    const double step_s = r.extend_s + r.decode_s;
    worst_share = std::max(worst_share, step_s > 0 ? r.allreduce_s / step_s : 0.0);
    worst_ratio = std::max(worst_ratio, r.check_max_ratio);
    rank_per_request = std::max(rank_per_request, r.state_bytes_per_request);
    pass = pass && r.check_pass != 0;
  }
  const double prefill_tps = extend_s > 0 ? static_cast<double>(extend_tokens) / extend_s : 0.0;
  const double decode_tps = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0.0;
  const std::string kernels = std::string("chunk_kda and fused_recurrent_kda ") + ActiveKernelDescription(kernel);

  // Projection weight (and Q8 scale) bytes one layer streams per step (this rank's shard under tp).
  const int64_t weight_bytes = model.layers.empty() ? 0 : model.layers.front()->projection_weight_bytes();
  std::printf(
      "kda bench: %s, %s, %d %s layers (hidden %lld, %d key / %d value heads x %d / %d, conv %d), %s activations, "
      "%s projection weights (%.1f MB per layer), fp32 state\n",
      opt.model_dir.empty() ? "embedded default (random weights)" : opt.model_dir.c_str(), model.model_type.c_str(), L,
      model.family().layer_class.c_str(), static_cast<long long>(full.hidden), full.H, full.HV, full.K, full.V, full.W,
      opt.dtype.c_str(), WeightFormatName(model.weights_format), static_cast<double>(weight_bytes) / 1e6);
  std::printf(
      "workload: %d requests, prompts %lld..%lld tokens, %lld decode steps each, prefill chunk %lld, "
      "step budget %lld, max running %lld, %d threads\n",
      opt.requests, static_cast<long long>(opt.min_prompt), static_cast<long long>(opt.max_prompt),
      static_cast<long long>(opt.decode_steps), static_cast<long long>(opt.prefill_chunk),
      static_cast<long long>(opt.step_token_budget), static_cast<long long>(running), NumThreads());
  if (multi) {
    std::printf("parallel: tp %d x dp %d = %d ranks (heads split over tp, requests over dp; table: rank 0's steps)\n",
                groups.tp_size(), groups.dp_size(), groups.world().size());
  }
  for (const std::string& n : served.notes) std::printf("note: %s\n", n.c_str());
  std::printf("kernels: %s\n", kernels.c_str());
  // The GEMM routes per class of rows; the fp32 pipeline always uses fp32 FMAs.
  std::printf("projections: GEMM routes %s\n\n", GemmRouteDescription(model.act_dtype).c_str());
  std::printf("  %-8s %6s %8s %12s %14s\n", "mode", "batch", "steps", "ms/step", "tokens/s");
  for (const auto& [key, val] : by_batch) {
    const auto mode = static_cast<ForwardMode>(key.first);
    int64_t toks = 0;
    for (const StepRecord& s : served.steps) {
      if (s.mode == mode && s.batch_size == key.second) toks += s.tokens;
    }
    std::printf("  %-8s %6lld %8lld %12.2f %14.1f\n", ForwardModeName(mode), static_cast<long long>(key.second),
                static_cast<long long>(val.first), val.second * 1e3 / static_cast<double>(val.first),
                static_cast<double>(toks) / val.second);
  }
  std::printf("\n  prefill: %lld tokens in %.2f s = %.1f tokens/s\n", static_cast<long long>(extend_tokens), extend_s,
              prefill_tps);
  std::printf("  decode:  %lld tokens in %.2f s = %.1f tokens/s\n", static_cast<long long>(decode_tokens), decode_s,
              decode_tps);
  const double prefill_us_per_layer = prefill_tps > 0 ? 1e6 / (prefill_tps * L) : 0.0;
  if (one_shot_us > 0) {
    std::printf(
        "  prefill per layer: %.1f us/token served, %.1f us/token one-shot (one sequence of %lld tokens): %.3gx\n",
        prefill_us_per_layer, one_shot_us, static_cast<long long>(opt.max_prompt), prefill_us_per_layer / one_shot_us);
  }
  std::printf("  state: %.2f MiB per request, %.2f MiB for %lld running requests (plus the dummy slot)\n",
              static_cast<double>(per_request) / (1 << 20), static_cast<double>(per_request * running) / (1 << 20),
              static_cast<long long>(running));
  if (multi) {
    std::printf("\n  %4s %3s %3s %8s %8s %14s %12s %13s %16s\n", "rank", "tp", "dp", "v heads", "requests",
                "state MiB/req", "state MiB", "all-reduce s", "all-reduce share");
    for (size_t i = 0; i < ranks.size(); ++i) {
      const RankStats& r = ranks[i];
      const double step_s = r.extend_s + r.decode_s;
      const std::string heads = std::to_string(r.heads_begin) + "-" + std::to_string(r.heads_begin + r.heads_count - 1);
      std::printf("  %4zu %3d %3d %8s %8d %14.2f %12.2f %13.3f %15.1f%%\n", i, r.tp_rank, r.dp_rank, heads.c_str(),
                  r.requests, static_cast<double>(r.state_bytes_per_request) / (1 << 20),
                  static_cast<double>(r.state_bytes_per_request * r.running) / (1 << 20), r.allreduce_s,
                  step_s > 0 ? 100.0 * r.allreduce_s / step_s : 0.0);
    }
    std::printf("\n");
  }
  std::printf(
      "  self-check (request %d, each layer served vs one-shot on the same input): worst out %s; worst state "
      "%s -> %s\n",
      probe, check.out.Summary().c_str(), check.state.Summary().c_str(), check.pass ? "PASS" : "FAIL");
  if (multi) {
    std::printf(
        "  self-check on every rank (each data-parallel share's middle request, each rank its heads): "
        "worst max_ratio %.3g -> %s\n",
        worst_ratio, pass ? "PASS" : "FAIL");
  }
  if (opt.json) {
    const GemmPlan plan = PipelineGemmPlan(model.act_dtype);
    std::printf(
        "{\"prefill_tokens_per_s\": %.3f, \"decode_tokens_per_s\": %.3f, \"state_bytes_per_request\": %lld, "
        "\"state_bytes_total\": %lld, \"self_check_max_ratio\": %.6g, \"requests\": %d, \"layers\": %d, "
        "\"prefill_tokens\": %lld, \"decode_tokens\": %lld, \"dtype\": \"%s\", \"threads\": %d, "
        "\"kernel\": \"%s\", \"tp\": %d, \"dp\": %d, \"rank_state_bytes_per_request\": %lld, "
        "\"allreduce_time_share\": %.6g, \"weights\": \"%s\", \"weight_bytes_per_layer\": %lld, \"gemm_route\": "
        "\"%s\", \"gemm_route_decode\": \"%s\", \"gemm_route_batch\": \"%s\", \"gemm_route_prefill\": \"%s\", "
        "\"model_type\": \"%s\"",
        prefill_tps, decode_tps, static_cast<long long>(per_request), static_cast<long long>(per_request) * running,
        worst_ratio, opt.requests, L, static_cast<long long>(extend_tokens), static_cast<long long>(decode_tokens),
        opt.dtype.c_str(), NumThreads(), ActiveKernelDescription(kernel), groups.tp_size(), groups.dp_size(),
        static_cast<long long>(rank_per_request), worst_share, WeightFormatName(model.weights_format),
        static_cast<long long>(weight_bytes), GemmPlanName(plan).c_str(), GemmRouteName(plan.decode),
        GemmRouteName(plan.batch), GemmRouteName(plan.prefill), model.model_type.c_str());
    if (one_shot_us > 0) {
      std::printf(
          ", \"prefill_us_per_token_per_layer\": %.3f, \"one_shot_layer_us_per_token\": %.3f, "
          "\"prefill_ratio_to_one_shot\": %.6g",
          prefill_us_per_layer, one_shot_us, prefill_us_per_layer / one_shot_us);
    }
    std::printf("}\n");
  }
  return pass ? 0 : 1;
}

// This rank's part of the benchmark (every rank of the job runs it).
int BenchOnRanks(const BenchOptions& opt, DType dtype, WeightFormat wf, KernelImpl kernel, ParallelRuntime* rt) {
  const ParallelGroups& groups = rt->groups();
  const bool root = groups.is_root();
  TimedCommunicator tp_comm(&groups.tp());  // the layers' all-reduces, timed

  // The benchmarked layers with activations in `act` (the self-check of a
  // bf16 run also makes them in fp32).
  const auto make_model = [&](DType act) {
    DeltaRuleModel m;
    if (opt.model_dir.empty()) {
      Check(opt.layers >= 1, "--layers must be >= 1");
      const LayerFamily& family = LayerFamilyFor(opt.model_type);
      m = DeltaRuleModel::Random(opt.model_type, family.reference, opt.layers, act, 20261129, &tp_comm, wf);
    } else {
      m = DeltaRuleModel::Load(opt.model_dir, act, std::nullopt, &tp_comm, wf);
      Check(opt.layers >= 0, "--layers must be >= 0");
      if (opt.layers > 0 && opt.layers < m.num_layers()) {
        m.layers.erase(m.layers.begin() + opt.layers, m.layers.end());
        m.model_layer_ids.resize(static_cast<size_t>(opt.layers));
      }
    }
    return m;
  };
  DeltaRuleModel model;
  rt->RunAgreed([&] { model = make_model(dtype); });
  const Workload w = MakeWorkload(opt, model);
  ParallelServeOptions serve_opt = BenchServingOptions(opt, kernel);
  serve_opt.prefix_cache_bytes = 0;  // the default workload serves without the prefix cache
  serve_opt.gather = false;          // the self-check compares each rank's own states

  std::vector<ServeRequest> requests;
  std::vector<int64_t> tokens;
  for (int i = 0; i < opt.requests; ++i) {
    ServeRequest r;
    r.id = i;
    r.input = w.inputs[i].view();
    r.length = w.prompts[i] + w.decode_steps;
    r.decode_tokens = opt.decode_steps;
    requests.push_back(r);
    tokens.push_back(r.length);
  }
  // The traced request: the middle one of this data-parallel rank's share
  // (of all requests in one process).
  const std::vector<int> owner = AssignRequestsToDpRanks(tokens, groups.dp_size());
  std::vector<int> mine;
  for (int i = 0; i < opt.requests; ++i) {
    if (owner[i] == groups.dp_rank()) mine.push_back(i);
  }
  const int probe = mine.empty() ? -1 : mine[mine.size() / 2];
  RequestTrace trace(probe, model.num_layers());
  serve_opt.observer = probe >= 0 ? &trace : nullptr;
  // Not agreed: the layers all-reduce, so an error on one rank ends the job
  // (RunOnRanks).
  const ParallelServeResult served = ServeParallel(model, groups, requests, serve_opt);
  const double allreduce_s = tp_comm.allreduce_seconds();
  const double one_shot_us =
      opt.vs_one_shot ? OneShotLayerUsPerToken(model.model_type, model.full_geometry(), dtype, kernel, opt.max_prompt)
                      : 0.0;
  const std::vector<StepRecord>& steps = served.steps;

  // Self-check, layer by layer: the traced request again, alone, every row in
  // one EXTEND step, each layer fed the input it saw while served. Its output
  // and final state must match the served ones (comparing only the last
  // layer's output would mix in bf16 rounding flips of earlier layers, which
  // a deep bf16 stack amplifies). Each rank checks its own heads.
  SelfCheck check;
  if (probe >= 0) {  // not agreed either: the replay all-reduces too
    const auto it =
        std::find_if(served.local.begin(), served.local.end(), [&](const RequestResult& r) { return r.id == probe; });
    Check(it != served.local.end(), "bench: the traced request did not finish");
    std::optional<DeltaRuleModel> exact;
    if (dtype == DType::kBF16) exact = make_model(DType::kF32);
    check = ReplayCheck(model, exact ? &*exact : nullptr, trace, *it, kernel);
  }
  double extend_s = 0;
  double decode_s = 0;
  int64_t extend_tokens = 0;
  int64_t decode_tokens = 0;
  std::map<std::pair<int, int64_t>, std::pair<int64_t, double>> by_batch;  // (mode, batch) -> (count, seconds)
  for (const StepRecord& s : steps) {
    if (s.mode == ForwardMode::kDecode) {
      decode_s += s.seconds;
      decode_tokens += s.tokens;
    } else {
      extend_s += s.seconds;
      extend_tokens += s.tokens;
    }
    auto& e = by_batch[{static_cast<int>(s.mode), s.batch_size}];
    ++e.first;
    e.second += s.seconds;
  }
  const int L = model.num_layers();
  const int64_t per_request = RecurrentStatePool::BytesPerRequest(L, model.full_geometry().state_spec(), dtype);

  // Every rank's numbers at world rank 0.
  RankStats mine_stats;
  mine_stats.tp_rank = groups.tp_rank();
  mine_stats.dp_rank = groups.dp_rank();
  // The value heads held: a key head's value heads split over several ranks show as their parts.
  mine_stats.heads_begin = (model.heads.begin * model.heads.split + model.heads.part) * model.geometry.group();
  mine_stats.heads_count = model.geometry.HV;
  mine_stats.requests = static_cast<int32_t>(mine.size());
  mine_stats.check_pass = check.pass ? 1 : 0;
  mine_stats.running = served.pool_capacity;
  mine_stats.state_bytes_per_request = RecurrentStatePool::BytesPerRequest(L, model.state_spec(), dtype);
  mine_stats.extend_tokens = extend_tokens;
  mine_stats.decode_tokens = decode_tokens;
  mine_stats.extend_s = extend_s;
  mine_stats.decode_s = decode_s;
  mine_stats.allreduce_s = allreduce_s;
  mine_stats.check_max_ratio = std::max(check.out.max_ratio, check.state.max_ratio);
  std::vector<RankStats> ranks;
  rt->RunAgreed([&] {
    for (const std::vector<uint8_t>& b : groups.world().Gather(&mine_stats, sizeof(mine_stats), 0)) {
      Check(b.size() == sizeof(RankStats), "bench: bad per-rank statistics");
      RankStats r;
      std::memcpy(&r, b.data(), sizeof(r));
      ranks.push_back(r);
    }
  });
  int status = 0;
  if (root)
    status = PrintReport(opt, model, kernel, served, by_batch, check, per_request, probe, ranks, groups, one_shot_us);
  std::fflush(stdout);
  groups.world().Broadcast(&status, sizeof(status), 0);
  return status;
}

}  // namespace

ParallelServeOptions BenchServingOptions(const BenchOptions& opt, KernelImpl kernel) {
  ParallelServeOptions options;
  options.scheduler.max_running = opt.max_running;
  options.scheduler.prefill_chunk = opt.prefill_chunk;
  options.scheduler.step_token_budget = opt.step_token_budget;
  options.scheduler.snapshot_interval = opt.snapshot_interval;
  options.state_budget_bytes = static_cast<int64_t>(opt.state_budget_mib * 1024.0 * 1024.0);
  options.prefix_cache_bytes = static_cast<int64_t>(opt.prefix_cache_mib * 1024.0 * 1024.0);
  options.kernel = kernel;
  return options;
}

int RunBenchCommand(const BenchOptions& opt) {
  const DType dtype = ParseActivationDType(opt.dtype);
  const WeightFormat wf = ParseWeightFormat(opt.weights);
  const KernelImpl kernel = ParseKernelImpl(opt.kernel);
  ResolveKernelImpl(kernel);
  Check(opt.requests >= 1, "--requests must be >= 1");
  Check(opt.min_prompt >= 1 && opt.max_prompt >= opt.min_prompt, "--min-prompt/--max-prompt: need 1 <= min <= max");
  Check(opt.decode_steps >= 0, "--decode-steps must be >= 0");
  Check(opt.threads >= 0, "--threads must be >= 0");
  ValidateServingOptions(BenchServingOptions(opt, kernel), OptionNames::kFlags);
  SetNumThreads(opt.threads);
  Check(opt.workload == "default" || opt.workload == "multi-turn" || opt.workload == "speculative",
        "--workload must be default, multi-turn or speculative, got '" + opt.workload + "'");
  Check(!opt.vs_one_shot || (opt.workload == "default" && opt.tp == 1 && opt.dp == 1),
        "--vs-one-shot needs the default workload in one process (no --tp/--dp)");
  Check(!opt.vs_one_shot || wf == WeightFormat::kDense,
        "--vs-one-shot times a layer with bf16 weights: use --weights bf16");
  if (opt.workload == "multi-turn") return RunMultiTurnBench(opt, dtype, wf, kernel);
  if (opt.workload == "speculative") return RunSpeculativeBench(opt, dtype, kernel);
  // One process, or this rank of tp x dp under mpirun.
  const std::unique_ptr<ParallelRuntime> rt = ParallelRuntime::Start(opt.tp, opt.dp);
  return RunOnRanks(*rt, [&] { return BenchOnRanks(opt, dtype, wf, kernel, rt.get()); });
}

}  // namespace kda::cli
