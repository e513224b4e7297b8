#include "tools/run_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/base/tolerance.h"
#include "kda/distributed/parallel_groups.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/gemm_route.h"
#include "kda/kernels/q8.h"
#include "kda/models/layer_family.h"
#include "kda/serving/parallel.h"
#include "kda/serving/scheduler.h"
#include "tools/rank_errors.h"
#include "tools/run_input.h"

namespace kda::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

ActBuffer ToAct(DType dt, const std::vector<float>& v) {
  ActBuffer b(dt, static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) b.Set(static_cast<int64_t>(i), v[i]);
  return b;
}

// The outputs of serving a packed batch: rows in input order, states per
// sequence (at world rank 0; the step counts are this rank's).
struct Served {
  std::vector<float> out;         // [T, hidden]
  std::vector<float> rec;         // [N, L, H, K, V]
  std::vector<float> conv;        // [N, L, W-1, 3P]
  std::vector<uint8_t> computed;  // [T]: 0 for rows reused from the prefix cache
  int64_t reused = 0;             // rows reused from the prefix cache
  int64_t steps = 0;
  double extend_s = 0.0, decode_s = 0.0;
  int64_t extend_steps = 0, decode_steps = 0;
};

int64_t MiBToBytes(double mib) { return static_cast<int64_t>(mib * 1024.0 * 1024.0); }

// What `kda run`'s flags ask of the serving stack (ValidateServingOptions' rules, named by flag).
ParallelServeOptions ServingOptionsOf(const RunOptions& opt, KernelImpl kernel) {
  ParallelServeOptions options;
  options.scheduler.max_running = opt.max_running;
  options.scheduler.prefill_chunk = opt.prefill_chunk;
  options.scheduler.snapshot_interval = opt.snapshot_interval;
  options.prefix_cache_bytes = MiBToBytes(opt.prefix_cache_mib);
  options.kernel = kernel;
  options.gather = false;
  return options;
}

// Serves sequence n = rows [cu[n], cu[n+1]) of x as request n, each rank its
// data-parallel share through a fresh pool of its heads, with optional initial
// states (full [N, L, ...] layouts, null for zero) and token ids [T] (null:
// none; the prefix cache's key). Every sequence joins each EXTEND step.
// Collective over the groups; each phase's errors are agreed before the next
// collective.
Served Serve(ParallelRuntime& rt, const DeltaRuleModel& model, const ActBuffer& x, const std::vector<int64_t>& cu,
             const float* init_rec, const ActBuffer* init_conv, const std::vector<int64_t>& decode_tokens,
             ParallelServeOptions options, const std::vector<int32_t>* ids = nullptr) {
  const auto N = static_cast<int64_t>(cu.size()) - 1;
  const int L = model.num_layers();
  const DeltaRuleGeometry ss = model.full_geometry();
  const int64_t hidden = model.geometry.hidden;
  const int64_t rs = ss.state_spec().recurrent_size();
  const int64_t cs = ss.state_spec().conv_size();
  std::vector<ServeRequest> requests;
  for (int64_t n = 0; n < N; ++n) {
    ServeRequest r;
    r.id = n;
    r.input = Offset(x.view(), cu[n] * hidden);
    r.length = cu[n + 1] - cu[n];
    r.decode_tokens = decode_tokens[n];
    if (init_rec != nullptr) r.initial_recurrent = init_rec + n * L * rs;
    if (init_conv != nullptr) r.initial_conv = Offset(init_conv->view(), n * L * cs).data;
    if (ids != nullptr && !ids->empty()) r.token_ids = ids->data() + cu[n];
    requests.push_back(r);
  }
  options.scheduler.step_token_budget = std::max<int64_t>(cu.back(), 1);
  options.gather = false;
  const ParallelGroups& groups = rt.groups();
  // Not agreed: the layers all-reduce, so an error on one rank ends the job
  // (RunOnRanks).
  ParallelServeResult served = ServeParallel(model, groups, requests, options);
  std::vector<RequestResult> results;
  rt.RunAgreed([&] { results = GatherResults(model, groups, std::move(served.local)); });

  Served s;
  s.out.assign(static_cast<size_t>(cu.back() * hidden), 0.0F);
  s.rec.assign(static_cast<size_t>(N * L * rs), 0.0F);
  s.conv.assign(static_cast<size_t>(N * L * cs), 0.0F);
  s.computed.assign(static_cast<size_t>(cu.back()), 1);
  for (const RequestResult& r : results) {
    std::fill_n(s.computed.begin() + cu[r.id], r.cached_tokens, uint8_t{0});
    s.reused += r.cached_tokens;
    const std::vector<float> o = BytesToFloat(r.out, model.act_dtype);
    std::copy(o.begin(), o.end(), s.out.begin() + cu[r.id] * hidden);
    std::copy(r.final_recurrent.begin(), r.final_recurrent.end(), s.rec.begin() + r.id * L * rs);
    const std::vector<float> c = BytesToFloat(r.final_conv, model.act_dtype);
    std::copy(c.begin(), c.end(), s.conv.begin() + r.id * L * cs);
  }
  for (const StepRecord& st : served.steps) {
    ++s.steps;
    if (st.mode == ForwardMode::kDecode) {
      s.decode_s += st.seconds;
      ++s.decode_steps;
    } else {
      s.extend_s += st.seconds;
      ++s.extend_steps;
    }
  }
  return s;
}

// ", tp 2 x dp 1 ranks" under mpirun; empty for one process.
std::string ParallelNote(const ParallelGroups& g) {
  if (g.world().size() == 1) return "";
  return ", tp " + std::to_string(g.tp_size()) + " x dp " + std::to_string(g.dp_size()) + " ranks";
}

// Every rank loads its heads' shard and reads the whole input; world rank 0
// writes the output file with the full states.
int RunOnFiles(const RunOptions& opt, DType dtype, WeightFormat wf, KernelImpl kernel, ParallelRuntime& rt) {
  const ParallelGroups& groups = rt.groups();
  DeltaRuleModel model;
  int layer = 0;
  int64_t T = 0;
  int64_t N = 0;
  std::vector<int64_t> cu;
  std::vector<float> rec;
  std::vector<float> conv;
  std::vector<int32_t> ids;
  ActBuffer x;
  ActBuffer conv_act;
  // Loading and input checks: no collective inside, so a rank that fails
  // here (a file missing on one host) stops every rank with its message.
  rt.RunAgreed([&] {
    Check(!opt.input.empty(), "--input is required with --model");
    Check(!opt.output.empty(), "--output is required with --model");
    const ModelConfig config = LoadModelConfig(opt.model_dir);
    layer = opt.layer_given ? opt.layer : config.FirstLinearLayer();
    // The input is checked (shapes, cu_seqlens, finite values) before the weights are read.
    const DeltaRuleGeometry shape = LayerFamilyFor(config.model_type).geometry(config);
    RunInput input = ReadRunInput(SafetensorsFile::Open(opt.input), shape);
    model = DeltaRuleModel::Load(opt.model_dir, config, dtype, layer, &groups.tp(), wf);
    T = input.T;
    N = input.N;
    cu = std::move(input.cu);
    rec = std::move(input.rec);
    conv = std::move(input.conv);
    ids = std::move(input.ids);
    // One layer: [N, 1, ...] is [N, ...]. A missing part starts from zero.
    if (!rec.empty() && conv.empty()) conv.assign(static_cast<size_t>(N * shape.state_spec().conv_size()), 0.0F);
    if (rec.empty() && !conv.empty()) rec.assign(static_cast<size_t>(N * shape.state_spec().recurrent_size()), 0.0F);
    x = ToAct(dtype, input.x);
    conv_act = ToAct(dtype, conv);
  });
  const DeltaRuleGeometry shape = model.full_geometry();
  std::vector<int64_t> decode(static_cast<size_t>(N), opt.decode_last);

  ParallelServeOptions options = ServingOptionsOf(opt, kernel);
  if (!opt.prefix_cache) options.prefix_cache_bytes = 0;
  const auto t0 = Clock::now();
  const Served s = Serve(rt, model, x, cu, rec.empty() ? nullptr : rec.data(), conv.empty() ? nullptr : &conv_act,
                         decode, options, &ids);
  const double secs = SecondsSince(t0);

  const auto dims = shape.state_dims();
  rt.RunAgreed([&] {
    if (!groups.is_root()) return;
    std::vector<TensorToWrite> tensors = {
        {"out", DType::kF32, {T, shape.hidden}, s.out.data()},
        {"final_recurrent_state", DType::kF32, {N, dims[0], dims[1], dims[2]}, s.rec.data()},
        {"final_conv_state", DType::kF32, {N, shape.W - 1, shape.conv_channels()}, s.conv.data()}};
    // With the prefix cache, the rows reused from it are zeros in `out`: `computed` says which rows were computed.
    if (opt.prefix_cache) tensors.push_back({"computed", DType::kU8, {T}, s.computed.data()});
    WriteSafetensors(opt.output, tensors,
                     {{"layer", std::to_string(layer)}, {"dtype", opt.dtype}, {"weights", WeightFormatName(wf)}});
  });
  if (!groups.is_root()) return 0;
  if (opt.prefix_cache) {
    std::printf("prefix cache: %lld of %lld prompt tokens reused\n", static_cast<long long>(s.reused),
                static_cast<long long>(T));
  }
  std::printf(
      "layer %d (%s, %s weights, kernel %s, GEMM routes %s%s): %lld tokens in %lld sequences, %lld steps (%lld "
      "EXTEND, %lld DECODE), %.3f ms -> %s\n",
      layer, opt.dtype.c_str(), WeightFormatName(wf), ActiveKernelDescription(kernel),
      GemmPlanName(PipelineGemmPlan(ParseActivationDType(opt.dtype))).c_str(), ParallelNote(groups).c_str(),
      static_cast<long long>(T), static_cast<long long>(N), static_cast<long long>(s.steps),
      static_cast<long long>(s.extend_steps), static_cast<long long>(s.decode_steps), secs * 1e3, opt.output.c_str());
  return 0;
}

std::vector<int64_t> ParseLengths(const std::string& s) {
  std::vector<int64_t> lens;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t pos = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    Check(pos == item.size() && !item.empty() && v >= 0, "--lengths: '" + item + "' is not a non-negative integer");
    lens.push_back(v);
  }
  Check(!lens.empty(), "--lengths is empty");
  return lens;
}

// The embedded default: Kimi-Linear-48B's KDA shapes with deterministic random
// weights. Runs the packed batch as one EXTEND (chunk kernel), then again with
// every token after the first as a DECODE step (recurrent kernel), and
// compares the two.
int RunEmbeddedDefault(const RunOptions& opt, DType dtype, WeightFormat wf, KernelImpl kernel, ParallelRuntime& rt) {
  const DeltaRuleGeometry shape = LayerFamilyFor("kimi_linear").reference;
  const std::vector<int64_t> lens = ParseLengths(opt.lengths);
  const auto N = static_cast<int64_t>(lens.size());
  std::vector<int64_t> cu(1, 0);
  for (int64_t l : lens) cu.push_back(cu.back() + l);
  const int64_t T = cu.back();

  const ParallelGroups& groups = rt.groups();
  DeltaRuleModel model;
  rt.RunAgreed([&] { model = DeltaRuleModel::Random("kimi_linear", shape, 1, dtype, 20261129, &groups.tp(), wf); });
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> xv(static_cast<size_t>(T * shape.hidden));
  for (float& v : xv) v = RoundBF16(normal(rng));
  const ActBuffer x = ToAct(dtype, xv);

  const bool root = groups.is_root();
  if (root) {
    std::printf(
        "kda run: embedded default (hidden %lld, %d heads x %d, conv %d, random weights), %s, %s weights, %d "
        "threads%s\n",
        static_cast<long long>(shape.hidden), shape.H, shape.K, shape.W, opt.dtype.c_str(), WeightFormatName(wf),
        NumThreads(), ParallelNote(groups).c_str());
    std::printf("batch: %lld sequences, %lld tokens (lengths %s)\n", static_cast<long long>(N),
                static_cast<long long>(T), opt.lengths.c_str());
  }
  const std::vector<int64_t> no_decode(static_cast<size_t>(N), 0);
  std::vector<int64_t> all_decode;
  all_decode.reserve(lens.size());
  for (int64_t l : lens) all_decode.push_back(std::max<int64_t>(l - 1, 0));
  // The whole batch in one EXTEND step, then every row but the first of each sequence as DECODE steps.
  ParallelServeOptions options;
  options.kernel = kernel;
  const Served a = Serve(rt, model, x, cu, nullptr, nullptr, no_decode, options);
  const Served b = Serve(rt, model, x, cu, nullptr, nullptr, all_decode, options);
  // The bf16 rule (design §5) also measures both runs against the exact
  // output: the fp32 pipeline (the same weights unrounded, fp32 activations)
  // on the same bf16-exact input, in one EXTEND. Decode may differ from
  // prefill in bf16 rounding flips, but must be no less accurate.
  Served exact;
  if (dtype == DType::kBF16) {
    DeltaRuleModel model32;
    rt.RunAgreed(
        [&] { model32 = DeltaRuleModel::Random("kimi_linear", shape, 1, DType::kF32, 20261129, &groups.tp(), wf); });
    exact = Serve(rt, model32, ToAct(DType::kF32, xv), cu, nullptr, nullptr, no_decode, options);
  }
  if (!root) {
    int ok = 0;
    groups.world().Broadcast(&ok, sizeof(ok), 0);  // the verdict is world rank 0's
    return ok != 0 ? 0 : 1;
  }

  const ToleranceReport out_rep = dtype == DType::kF32
                                      ? CompareF32(b.out.data(), a.out.data(), a.out.size())
                                      : CompareBF16(b.out.data(), a.out.data(), exact.out.data(), a.out.size());
  const ToleranceReport state_rep = dtype == DType::kF32
                                        ? CompareF32(b.rec.data(), a.rec.data(), a.rec.size())
                                        : CompareBF16(b.rec.data(), a.rec.data(), exact.rec.data(), a.rec.size());
  std::printf("prefill (EXTEND, chunk kernel %s): %8.1f ms  %8.1f us/token\n", ActiveKernelDescription(kernel),
              a.extend_s * 1e3, a.extend_s * 1e6 / static_cast<double>(std::max<int64_t>(T, 1)));
  std::printf("decode  (DECODE, recurrent kernel): %lld steps %8.1f ms  %8.1f us/step\n",
              static_cast<long long>(b.decode_steps), b.decode_s * 1e3,
              b.decode_s * 1e6 / static_cast<double>(std::max<int64_t>(b.decode_steps, 1)));
  std::printf("check chunk vs recurrent: out %s; final state %s -> %s\n", out_rep.Summary().c_str(),
              state_rep.Summary().c_str(), out_rep.ok && state_rep.ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  int ok = out_rep.ok && state_rep.ok ? 1 : 0;
  groups.world().Broadcast(&ok, sizeof(ok), 0);
  return ok != 0 ? 0 : 1;
}

}  // namespace

int RunLayerCommand(const RunOptions& opt) {
  const DType dtype = ParseActivationDType(opt.dtype);
  const WeightFormat wf = ParseWeightFormat(opt.weights);
  const KernelImpl kernel = ParseKernelImpl(opt.kernel);
  ResolveKernelImpl(kernel);  // an unavailable implementation is refused before any work
  Check(opt.threads >= 0, "--threads must be >= 0");
  Check(opt.decode_last >= 0, "--decode-last must be >= 0");
  ValidateServingOptions(ServingOptionsOf(opt, kernel), OptionNames::kFlags);
  SetNumThreads(opt.threads);
  if (opt.model_dir.empty()) {
    Check(opt.input.empty() && opt.output.empty(), "--input and --output need --model");
    Check(!opt.prefix_cache, "--prefix-cache needs --model (and input_ids in the input file)");
  }
  // One process, or this rank of tp x dp under mpirun (the checks above are
  // the same on every rank, so they stop each one before MPI starts).
  const std::unique_ptr<ParallelRuntime> rt = ParallelRuntime::Start(opt.tp, opt.dp);
  return RunOnRanks(*rt, [&] {
    return opt.model_dir.empty() ? RunEmbeddedDefault(opt, dtype, wf, kernel, *rt)
                                 : RunOnFiles(opt, dtype, wf, kernel, *rt);
  });
}

}  // namespace kda::cli
