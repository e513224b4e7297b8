#include "tools/bench_kernels_command.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/bench/cache.h"
#include "kda/bench/kernel_problems.h"
#include "kda/bench/layer_problem.h"
#include "kda/bench/timing.h"
#include "kda/kernels/cpu_probe.h"
#include "kda/kernels/gemm_route.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "kda/kernels/q8.h"
#include "kda/models/delta_rule_model.h"

#include <sys/resource.h>

namespace kda::cli {
namespace {

using bench::Clock;
using bench::Median;
using bench::MedianSeconds;
using bench::Seconds;

// ------------------------------------------------------------ counters

// Deterministic counters of the process (all threads), read around a timed
// loop: a call that page-faults or whose workers sleep and are woken (a
// voluntary context switch each, e.g. under OMP_WAIT_POLICY=passive) is slow
// for a reason no clock shows.
struct ProcessCounters {
  int64_t minor_faults = 0;
  int64_t voluntary_switches = 0;

  static ProcessCounters Now() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return {u.ru_minflt, u.ru_nvcsw};
  }
};

// The share of [p, p + bytes) backed by transparent huge pages, from
// /proc/self/smaps (each mapping's AnonHugePages spread evenly over it);
// -1 where smaps cannot be read. Large inputs on 4 KiB pages make the
// kernels' per-token row walks miss the TLB; whether the kernel grants huge
// pages varies from run to run, so each row reports it.
double HugePageFraction(const void* p, size_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps || bytes == 0) return -1.0;
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const uintptr_t hi = lo + bytes;
  double huge = 0.0;
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long long a = 0;
    unsigned long long b = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
      start = a;
      end = b;
      continue;
    }
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kib) == 1 && end > lo && start < hi) {
      const double overlap = static_cast<double>(std::min(end, hi) - std::max(start, lo));
      huge += static_cast<double>(kib) * 1024.0 * overlap / static_cast<double>(end - start);
    }
  }
  return huge / static_cast<double>(bytes);
}

// The huge-page share of a prefill problem's q, k, v, g, weighted by bytes.
double InputHugePageFraction(const bench::ChunkProblem& p) {
  double huge = 0.0;
  double total = 0.0;
  for (const auto& [data, bytes] : p.InputBuffers()) {
    const double f = HugePageFraction(data, bytes);
    if (f < 0.0) return -1.0;
    huge += f * static_cast<double>(bytes);
    total += static_cast<double>(bytes);
  }
  return total > 0.0 ? huge / total : -1.0;
}

// ------------------------------------------------------------ machine ceilings

// The best rate in GFLOP/s of `threads` threads each running the register-only
// loop of `p` (kda/kernels/cpu_probe.h) for `iters` rounds, the best of
// max(3, repeats) timed runs after a short one that wakes the threads: a
// ceiling, so the best run, the least disturbed one. 0 where the instruction
// cannot run here.
double BestLoopGflops(int threads, int repeats, ProbeInstruction p, int64_t iters) {
  if (!CanRunProbe(p)) return 0.0;
  std::vector<float> sink(static_cast<size_t>(threads), 0.0F);
  ParallelFor(threads, [&](int64_t i) { RunProbeLoop(p, iters / 8, &sink[static_cast<size_t>(i)]); });
  double best = 0.0;
  for (int r = 0; r < std::max(3, repeats); ++r) {
    const Clock::time_point t0 = Clock::now();
    ParallelFor(threads, [&](int64_t i) { RunProbeLoop(p, iters, &sink[static_cast<size_t>(i)]); });
    const double s = Seconds(t0);
    best = std::max(best, static_cast<double>(threads) * static_cast<double>(iters) * ProbeFlopsPerRound(p) / s);
  }
  if (sink[0] == 42.0F) std::fputs("", stdout);  // keeps the loops observable
  return best / 1e9;
}

// The peak of `threads` threads for the instruction of `p` in GFLOP/s (GOP/s
// for int8 tiles), each loop sized to about 30 ms at one thread's rate; 0
// where the instruction cannot run here.
double MeasurePeakGflops(int threads, int repeats, ProbeInstruction p) {
  const double one_thread = ProbeGflopsOneThread(p, 1e-3, 1);
  if (one_thread <= 0.0) return 0.0;
  const double iters = 0.03 * one_thread * 1e9 / ProbeFlopsPerRound(p);
  return BestLoopGflops(threads, repeats, p, std::max<int64_t>(1, static_cast<int64_t>(iters)));
}

// memcpy bandwidth on buffers far larger than the last-level cache, split over
// `threads` threads: bytes copied per second (each byte read once and written
// once), the median of `repeats` runs, in GB/s.
double MeasureCopyGbps(int threads, int repeats) {
  constexpr size_t kBytes = size_t{256} << 20;
  const auto src = std::make_unique<char[]>(kBytes);
  const auto dst = std::make_unique<char[]>(kBytes);
  std::memset(src.get(), 1, kBytes);
  std::memset(dst.get(), 2, kBytes);
  const size_t part = kBytes / static_cast<size_t>(threads);
  auto copy = [&] {
    ParallelFor(threads, [&](int64_t i) {
      const size_t off = static_cast<size_t>(i) * part;
      std::memcpy(dst.get() + off, src.get() + off, part);
    });
  };
  copy();  // warm-up
  return static_cast<double>(kBytes) / MedianSeconds(std::max(1, repeats), copy) / 1e9;
}

// In-place read-modify-write bandwidth (the decode kernel's access pattern:
// each state byte read once and written back once) on a buffer far larger than
// the last-level cache: buffer bytes per second, the median of `repeats`, in GB/s.
double MeasureReadWriteGbps(int threads, int repeats, float scale) {
  constexpr size_t kFloats = size_t{64} << 20;  // 256 MiB
  const auto buf = std::make_unique<float[]>(kFloats);
  std::fill_n(buf.get(), kFloats, 1.0F);
  const size_t part = kFloats / static_cast<size_t>(threads);
  auto pass = [&] {
    ParallelFor(threads, [&](int64_t i) {
      float* x = buf.get() + static_cast<size_t>(i) * part;
      for (size_t j = 0; j < part; ++j) x[j] *= scale;
    });
  };
  pass();  // warm-up
  return static_cast<double>(kFloats * sizeof(float)) / MedianSeconds(std::max(1, repeats), pass) / 1e9;
}

// Read-only bandwidth over a buffer of `bytes` (a decode step's access to its
// weights: each byte read once), split over `threads` threads: bytes read per
// second, the median of `repeats` runs after one warm-up pass, in GB/s. The
// words are XOR-reduced, which the compiler vectorises (no FP reassociation).
double MeasureReadGbps(int threads, int repeats, int64_t bytes) {
  const size_t words = static_cast<size_t>(bytes) / sizeof(uint64_t);
  const auto buf = std::make_unique<uint64_t[]>(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9E3779B97F4A7C15ULL;
  const size_t part = words / static_cast<size_t>(threads);
  std::vector<uint64_t> sink(static_cast<size_t>(threads), 0);
  auto pass = [&] {
    ParallelFor(threads, [&](int64_t i) {
      const uint64_t* x = buf.get() + static_cast<size_t>(i) * part;
      uint64_t acc = 0;
      for (size_t j = 0; j < part; ++j) acc ^= x[j];
      sink[static_cast<size_t>(i)] ^= acc;
    });
  };
  pass();  // warm-up
  const double s = MedianSeconds(std::max(1, repeats), pass);
  if (sink[0] == 42) std::fputs("", stdout);  // keeps the reads observable
  return static_cast<double>(part * static_cast<size_t>(threads) * sizeof(uint64_t)) / s / 1e9;
}

struct Machine {
  int threads = 1;
  double fma_peak_gflops = 0.0;
  double bf16_dot_gflops = 0.0;  // vdpbf16ps peak; 0: no AVX512-BF16
  double amx_bf16_gflops = 0.0;  // tdpbf16ps peak; 0: no AMX tiles granted
  double amx_int8_gops = 0.0;    // tdpbssd peak (integer operations)
  double copy_gbps = 0.0;
  double rmw_gbps = 0.0;
  int64_t llc_bytes = 0;     // the last-level cache (sysfs; 0: unknown)
  int64_t stream_bytes = 0;  // what the decode rows cycle through (bench::DecodeStreamBytes)
  double read_gbps = 0.0;    // read-only rate over a buffer of stream_bytes
};

// ------------------------------------------------------------------- rows

// One measurement. The fixed fields first, then kernel-specific ones in order.
struct BenchRow {
  std::string kernel;      // chunk | recurrent | layer | decode_layer | projections | fla option rows | gdn rows
  std::string impl;        // reference | optimized
  std::string isa;         // the optimized kernels' ISA variant; "none" for the reference
  std::string dtype;       // float32 | bfloat16 | float16
  std::string weights;     // projection weights of the layer rows: bf16 | int8 | fp32 (empty: none)
  std::string gemm_route;  // the projection rows' GEMM route: bf16_dot | fp32_fma (empty: none)
  std::string model_type;  // the layer rows' layer family (empty: none)
  int H = 0;
  int K = 0;
  int64_t N = 0;
  int64_t T = 0;
  int threads = 0;
  int repeats = 0;
  double us_per_token = 0.0;
  std::vector<std::pair<std::string, double>> extra;
};

void PrintRow(const BenchRow& r, bool json) {
  if (json) {
    nlohmann::ordered_json j = {{"kernel", r.kernel}, {"impl", r.impl}, {"isa", r.isa}, {"dtype", r.dtype}};
    if (!r.weights.empty()) j["weights"] = r.weights;
    if (!r.gemm_route.empty()) j["gemm_route"] = r.gemm_route;
    if (!r.model_type.empty()) j["model_type"] = r.model_type;
    j.update(nlohmann::ordered_json{{"H", r.H},
                                    {"K", r.K},
                                    {"N", r.N},
                                    {"T", r.T},
                                    {"threads", r.threads},
                                    {"repeats", r.repeats},
                                    {"us_per_token", r.us_per_token}});
    for (const auto& [key, value] : r.extra) j[key] = value;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string extra = r.weights.empty() ? "" : "  weights=" + r.weights;
    if (!r.gemm_route.empty()) extra += "  gemm_route=" + r.gemm_route;
    for (const auto& [key, value] : r.extra) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "  %s=%.3g", key.c_str(), value);
      extra += buf;
    }
    std::printf("%-9s %-9s %-7s %-8s %3d %4d %3lld %5lld %3d %11.2f%s\n", r.kernel.c_str(), r.impl.c_str(),
                r.isa.c_str(), r.dtype.c_str(), r.H, r.K, static_cast<long long>(r.N), static_cast<long long>(r.T),
                r.threads, r.us_per_token, extra.c_str());
  }
  std::fflush(stdout);
}

void PrintHeader(const Machine& m, bool json) {
  if (json) return;
  std::printf(
      "machine: %d threads, fp32 FMA peak %.1f GFLOP/s, bf16 dot peak %.1f GFLOP/s, AMX bf16 peak %.1f GFLOP/s, AMX "
      "int8 peak %.1f GOP/s, memcpy %.2f GB/s copied, "
      "in-place r+w %.2f GB/s, read %.2f GB/s over %.0f MiB (last-level cache %.0f MiB)\n",
      m.threads, m.fma_peak_gflops, m.bf16_dot_gflops, m.amx_bf16_gflops, m.amx_int8_gops, m.copy_gbps, m.rmw_gbps,
      m.read_gbps, static_cast<double>(m.stream_bytes) / 1048576.0, static_cast<double>(m.llc_bytes) / 1048576.0);
  std::printf("%-9s %-9s %-7s %-8s %3s %4s %3s %5s %3s %11s\n", "kernel", "impl", "isa", "dtype", "H", "K", "N", "T",
              "thr", "us/token");
}

// The isa field of an implementation.
std::string IsaField(KernelImpl impl) {
  return impl == KernelImpl::kReference ? "none" : KernelIsaName(ActiveKernelIsa());
}

// ------------------------------------------------------------------- cases

// The kernel rows' heads: Kimi-Linear-48B's KDA layer (32 heads of 128).
constexpr int kHeads = 32;
constexpr int kHeadDim = 128;

// A layer family's real layer (the layer rows' shapes).
const DeltaRuleGeometry& ShapeOf(const std::string& model_type) { return LayerFamilyFor(model_type).reference; }

// The weights of one layer's projections: its tensor table's quantizable tensors
// (Kimi: q, k, v, f_a, f_b, b, g_a, g_b, o; design §1).
int64_t ProjectionWeightCount(const std::string& model_type) {
  int64_t n = 0;
  for (const TensorSpec& t : LayerFamilyFor(model_type).tensors(ShapeOf(model_type))) {
    if (t.quantizable) n += t.numel();
  }
  return n;
}

// A row's fixed fields (H and K the real shapes').
BenchRow Row(const Machine& m, const char* kernel, KernelImpl impl, DType dtype, int64_t n, int64_t t, int repeats) {
  BenchRow r;
  r.kernel = kernel;
  r.impl = KernelImplName(impl);
  r.isa = IsaField(impl);
  r.dtype = ActivationDTypeName(dtype);
  r.H = kHeads;
  r.K = kHeadDim;
  r.N = n;
  r.T = t;
  r.threads = m.threads;
  r.repeats = repeats;
  return r;
}

// The peak of the instruction a GEMM route multiplies with, measured in this run.
double RoutePeakGflops(const Machine& m, GemmRoute route) {
  switch (route) {
    case GemmRoute::kAmx:
      return m.amx_bf16_gflops;
    case GemmRoute::kBf16Dot:
      return m.bf16_dot_gflops;
    default:
      return m.fma_peak_gflops;
  }
}

// A row's rate as a share of the tile unit's bf16 peak of the same run, where
// the process has the tiles.
void AddTileShare(const Machine& m, double gflops, BenchRow* r) {
  if (m.amx_bf16_gflops <= 0.0) return;
  r->extra.emplace_back("amx_bf16_peak_gflops", m.amx_bf16_gflops);
  r->extra.emplace_back("share_of_amx_peak", gflops / m.amx_bf16_gflops);
}

// Prefill: chunk_kda over `lengths`. us_per_token is the median call time / T
// (best_us_per_token: the best call's); the floor is the recurrent form's
// 7 K V H flops per token at the FMA peak (itself the best of its runs).
BenchRow ChunkRow(const Machine& m, KernelImpl impl, DType dtype, const std::vector<int64_t>& lengths, int repeats) {
  bench::ChunkProblem p(lengths, kHeads, kHeadDim, dtype);
  if (impl == KernelImpl::kOptimized) chunk_kda(p.call, impl);  // warm-up (the reference is too slow for one)
  const ProcessCounters c0 = ProcessCounters::Now();
  const bench::RepeatedSeconds s = bench::TimeRepeats(repeats, [&] { chunk_kda(p.call, impl); });
  const ProcessCounters c1 = ProcessCounters::Now();
  BenchRow r = Row(m, "chunk", impl, dtype, p.N(), p.T(), repeats);
  r.us_per_token = s.median * 1e6 / static_cast<double>(p.T());
  const double best_us = s.best * 1e6 / static_cast<double>(p.T());
  const double floor_us = 7.0 * kHeadDim * kHeadDim * kHeads / (m.fma_peak_gflops * 1e3);
  r.extra = {{"fma_peak_gflops", m.fma_peak_gflops},
             {"flop_floor_us_per_token", floor_us},
             {"ratio_to_flop_floor", r.us_per_token / floor_us},
             {"best_us_per_token", best_us},
             {"best_ratio_to_flop_floor", best_us / floor_us},
             {"minflt_per_call", static_cast<double>(c1.minor_faults - c0.minor_faults) / repeats},
             {"vcsw_per_call", static_cast<double>(c1.voluntary_switches - c0.voluntary_switches) / repeats},
             {"input_huge_page_fraction", InputHugePageFraction(p)}};
  // The recurrent form's flops as a share of the tile unit's peak.
  AddTileShare(m, 7.0 * kHeadDim * kHeadDim * kHeads / (r.us_per_token * 1e3), &r);
  return r;
}

// Decode: one fused_recurrent_kda step of N sequences, the states cycling over
// enough layers' worth of buffers (>= 256 MiB) that each step reads them from
// memory. us_per_token is the median step time / N; the floors are the time to
// read and write the N states once at the memcpy bandwidth and at the in-place
// read-modify-write bandwidth (the tighter one here: glibc's memcpy of large
// buffers is slower than a plain in-place stream on this machine kind).
BenchRow RecurrentRow(const Machine& m, KernelImpl impl, int64_t n, int repeats) {
  const int layers = bench::DecodeProblem::LayersFor(n, kHeads, kHeadDim, m.stream_bytes);
  bench::DecodeProblem p(n, kHeads, kHeadDim, layers, DType::kF32);
  for (int i = 0; i < layers; ++i) fused_recurrent_kda(p.Step(i), impl);  // warm-up: one pass over the buffers
  std::vector<double> t;
  const int64_t steps = std::max<int64_t>(static_cast<int64_t>(repeats) * layers, 2 * layers);
  t.reserve(static_cast<size_t>(steps));  // nothing allocated or faulted between the clock reads
  const ProcessCounters c0 = ProcessCounters::Now();
  for (int64_t i = 0; i < steps; ++i) {
    const RecurrentKdaCall& call = p.Step(i);
    const Clock::time_point t0 = Clock::now();
    fused_recurrent_kda(call, impl);
    t.push_back(Seconds(t0));
  }
  const ProcessCounters c1 = ProcessCounters::Now();
  const double step_us = Median(t) * 1e6;
  const double state_bytes = static_cast<double>(n) * kHeads * kHeadDim * kHeadDim * sizeof(float);
  const double floor_us = state_bytes / (m.copy_gbps * 1e3);
  BenchRow r = Row(m, "recurrent", impl, DType::kF32, n, 1, static_cast<int>(steps));
  r.us_per_token = step_us / static_cast<double>(n);
  const double rmw_floor_us = state_bytes / (m.rmw_gbps * 1e3);
  r.extra = {{"step_us", step_us},
             {"copy_gbps", m.copy_gbps},
             {"copy_floor_us", floor_us},
             {"ratio_to_copy_floor", step_us / floor_us},
             {"rmw_gbps", m.rmw_gbps},
             {"rmw_floor_us", rmw_floor_us},
             {"ratio_to_rmw_floor", step_us / rmw_floor_us},
             {"minflt_per_call", static_cast<double>(c1.minor_faults - c0.minor_faults) / static_cast<double>(steps)},
             {"vcsw_per_call",
              static_cast<double>(c1.voluntary_switches - c0.voluntary_switches) / static_cast<double>(steps)},
             {"state_huge_page_fraction", HugePageFraction(p.states.data(), p.states.size() * sizeof(float))},
             {"streamed_bytes", static_cast<double>(p.states.size() * sizeof(float))}};
  return r;
}

// The whole layer at real shapes (hidden 2304): one EXTEND over T tokens of
// N sequences, and in the same run its projection GEMMs alone through the same
// GEMM library, the two timed alternately (a slow spell of the machine hits
// both); the ratio is the layer's median time over the GEMMs'.
BenchRow LayerRow(const Machine& m, const std::string& model_type, KernelImpl impl, DType dtype, int64_t n, int64_t t,
                  int repeats) {
  const DeltaRuleGeometry& shape = ShapeOf(model_type);
  bench::LayerProblem p(model_type, dtype, impl, shape, n, t);
  p.Forward();  // warm-up: GEMM primitives, scratch, first touches
  p.Gemms();
  const std::vector<std::vector<double>> s =
      bench::TimeAlternately(repeats, {[&](int64_t) { p.Forward(); }, [&](int64_t) { p.Gemms(); }});
  const double us_per_token = Median(s[0]) * 1e6 / static_cast<double>(t);
  const double gemm_us_per_token = Median(s[1]) * 1e6 / static_cast<double>(t);
  BenchRow r = Row(m, "layer", impl, dtype, n, t, repeats);
  r.model_type = model_type;
  r.H = shape.H;
  r.K = shape.K;
  r.us_per_token = us_per_token;
  // The projections' flops per token (2 per weight), against both routes' peaks of the same run.
  const double gemm_gflops = 2.0 * static_cast<double>(ProjectionWeightCount(model_type)) / (gemm_us_per_token * 1e3);
  r.extra = {{"hidden", static_cast<double>(shape.hidden)},
             {"HV", static_cast<double>(shape.HV)},
             {"V", static_cast<double>(shape.V)},
             {"gemm_us_per_token", gemm_us_per_token},
             {"ratio_to_gemm", us_per_token / gemm_us_per_token},
             {"gemm_gflops", gemm_gflops},
             {"fma_peak_gflops", m.fma_peak_gflops},
             {"bf16_dot_gflops", m.bf16_dot_gflops}};
  r.gemm_route = GemmRouteName(PipelineGemmPlan(dtype).ForRows(t));
  AddTileShare(m, gemm_gflops * gemm_us_per_token / us_per_token, &r);
  return r;
}

// Timed steps of a decode row (each a different layer of those cycled).
int64_t DecodeSteps(int repeats) { return std::max<int64_t>(static_cast<int64_t>(repeats) * 8, 16); }

// One decode step of the whole layer at real shapes, batch N, bf16
// activations, with bf16 and with int8 projection weights, timed alternately
// (a slow spell of the machine hits both), each step a different layer of
// enough (m.stream_bytes of weights: twice the last-level cache, at least
// 256 MiB) that its weights come from memory. Two rows: us_per_token is the
// median step time / N; the floors are the time to move the step's bytes
// (weights and scales read once, states and conv tails read and written) at
// the memcpy rate and at the read-only rate of a buffer of the streamed size;
// the int8 row has its speedup over bf16.
std::vector<BenchRow> LayerDecodeRows(const Machine& m, const std::string& model_type, int64_t n, int repeats) {
  const WeightFormat formats[2] = {WeightFormat::kDense, WeightFormat::kInt8};
  const DeltaRuleGeometry& shape = ShapeOf(model_type);
  std::vector<std::unique_ptr<bench::LayerDecodeProblem>> problems;
  for (WeightFormat f : formats) {
    const int64_t layer_bytes = bench::LayerProjectionBytes(model_type, DType::kBF16, f, shape);
    const int layers = bench::LayerDecodeProblem::LayersFor(layer_bytes, m.stream_bytes);
    problems.push_back(std::make_unique<bench::LayerDecodeProblem>(model_type, DType::kBF16, f, shape, n, layers));
    for (int i = 0; i < layers; ++i) problems.back()->Step(i);  // warm-up: one pass over the layers
  }
  const int64_t steps = DecodeSteps(repeats);
  const std::vector<std::vector<double>> t = bench::TimeAlternately(
      steps, {[&](int64_t i) { problems[0]->Step(i); }, [&](int64_t i) { problems[1]->Step(i); }});
  std::vector<BenchRow> rows;
  const double bf16_step_us = Median(t[0]) * 1e6;
  for (int f = 0; f < 2; ++f) {
    const bench::LayerDecodeProblem& p = *problems[f];
    const double step_us = Median(t[f]) * 1e6;
    const auto bytes = static_cast<double>(p.StepBytes());
    const double floor_us = bytes / (m.copy_gbps * 1e3);
    const double read_floor_us = bytes / (m.read_gbps * 1e3);
    BenchRow r = Row(m, "decode_layer", KernelImpl::kOptimized, DType::kBF16, n, 1, static_cast<int>(steps));
    r.model_type = model_type;
    r.H = shape.H;
    r.K = shape.K;
    r.weights = WeightFormatName(formats[f]);
    r.us_per_token = step_us / static_cast<double>(n);
    r.extra = {{"step_us", step_us},
               {"weight_bytes_per_layer", static_cast<double>(p.model.layers.front()->projection_weight_bytes())},
               {"step_bytes", bytes},
               {"copy_gbps", m.copy_gbps},
               {"copy_floor_us", floor_us},
               {"ratio_to_copy_floor", step_us / floor_us},
               {"streamed_bytes", static_cast<double>(p.model.num_layers()) *
                                      static_cast<double>(p.model.layers.front()->projection_weight_bytes())},
               {"read_gbps", m.read_gbps},
               {"read_floor_us", read_floor_us},
               {"ratio_to_read_floor", step_us / read_floor_us},
               {"speedup_vs_bf16", bf16_step_us / step_us}};
    rows.push_back(std::move(r));
  }
  return rows;
}

// The projection GEMMs of one layer at real shapes (DeltaRuleLayer's own
// Linears, q/k/v fused; kda::Linear's engines at M rows), with bf16, fp32 and
// int8 weights (bf16 activations, fp32 for the fp32 weights), the three timed
// alternately. At M <= kDecodeRows each call runs a different layer of
// enough (m.stream_bytes of weights, as the decode rows) that its weights come
// from memory, against the read floor (the weights read once at the
// read-only rate); every row against the flop floor at the peak of the
// instruction its GEMM route multiplies with (both measured in the same run).
constexpr int64_t kDecodeRows = 8;

constexpr const char* kKimi = "kimi_linear";

std::vector<BenchRow> ProjectionRows(const Machine& m, int64_t rows, int repeats) {
  struct Case {
    DType dtype;
    WeightFormat format;
    const char* weights;
  };
  const Case cases[] = {{DType::kBF16, WeightFormat::kDense, "bf16"},
                        {DType::kF32, WeightFormat::kDense, "fp32"},
                        {DType::kBF16, WeightFormat::kInt8, "int8"}};
  const bool streamed = rows <= kDecodeRows;
  std::vector<std::unique_ptr<bench::ProjectionProblem>> problems;
  std::vector<std::function<void(int64_t)>> steps;
  for (const Case& c : cases) {
    const int layers = streamed
                           ? bench::LayerDecodeProblem::LayersFor(
                                 bench::LayerProjectionBytes(kKimi, c.dtype, c.format, ShapeOf(kKimi)), m.stream_bytes)
                           : 1;
    problems.push_back(
        std::make_unique<bench::ProjectionProblem>(kKimi, c.dtype, c.format, ShapeOf(kKimi), rows, layers));
    bench::ProjectionProblem* p = problems.back().get();
    for (int i = 0; i < layers; ++i) p->Step(i);  // warm-up: GEMM primitives, one pass over the layers
    steps.emplace_back([p](int64_t i) { p->Step(i); });
  }
  const int64_t calls = streamed ? DecodeSteps(repeats) : repeats;
  const std::vector<std::vector<double>> t = bench::TimeAlternately(calls, steps);
  const double flops = 2.0 * static_cast<double>(ProjectionWeightCount(kKimi)) * static_cast<double>(rows);
  std::vector<BenchRow> out;
  for (size_t i = 0; i < problems.size(); ++i) {
    const bench::ProjectionProblem& p = *problems[i];
    const double call_us = Median(t[i]) * 1e6;
    // The fp32 pipeline always multiplies with fp32 FMAs; the bf16 one as the route says.
    const GemmRoute route = PipelineGemmPlan(cases[i].dtype).ForRows(rows);
    const double peak = RoutePeakGflops(m, route);
    const auto bytes = static_cast<double>(p.StepBytes());
    BenchRow r = Row(m, "projections", KernelImpl::kOptimized, cases[i].dtype, 1, rows, static_cast<int>(calls));
    r.weights = cases[i].weights;
    r.gemm_route = GemmRouteName(route);
    r.us_per_token = call_us / static_cast<double>(rows);
    r.extra = {{"M", static_cast<double>(rows)},
               {"hidden", static_cast<double>(ShapeOf(kKimi).hidden)},
               {"us_per_call", call_us},
               {"gflops", flops / (call_us * 1e3)},
               {"weight_bytes", bytes},
               {"weight_gbps", bytes / (call_us * 1e3)},
               {"compute_peak_gflops", peak},
               {"flop_floor_us", flops / (peak * 1e3)},
               {"ratio_to_flop_floor", call_us * peak * 1e3 / flops}};
    AddTileShare(m, flops / (call_us * 1e3), &r);
    // The most of the tile peak a call can reach where its weights come from memory (a served
    // model's layers do; this row's single layer may sit in the last-level cache): M flops per
    // weight at the read rate.
    if (m.amx_bf16_gflops > 0.0 && route == GemmRoute::kAmx) {
      r.extra.emplace_back("amx_share_at_read_rate", flops / (bytes / m.read_gbps) / m.amx_bf16_gflops);
    }
    if (streamed) {
      const double read_floor_us = bytes / (m.read_gbps * 1e3);
      r.extra.insert(r.extra.end(), {{"streamed_bytes", static_cast<double>(p.model.num_layers()) * bytes},
                                     {"read_gbps", m.read_gbps},
                                     {"read_floor_us", read_floor_us},
                                     {"ratio_to_read_floor", call_us / read_floor_us}});
    }
    out.push_back(std::move(r));
  }
  return out;
}

// fla's options (docs/fla-api.md), optimized kernels only, each against the
// same run's floor: the prefill with grouped value heads, in float16 and at
// K = V = 100 beside its plain fp32 / bf16 shape (per value head, the flop
// floor 7 K V per token and value head); the recurrence with T = 1 and 4
// tokens per sequence (contiguous states), and a speculative verification
// step (4 tokens per sequence, a pool slot per token). The rows compared with
// each other are timed alternately (one call of each case in turn, `repeats`
// rounds), so that a slow spell of the machine hits all of them.
std::vector<BenchRow> FlaOptionRows(const Machine& m, int repeats) {
  struct ChunkCase {
    const char* kernel;
    int H, HV, K, V;
    DType dtype;
  };
  const ChunkCase chunk_cases[] = {
      {"chunk_plain", 32, 32, 128, 128, DType::kF32},  {"chunk_grouped", 16, 32, 128, 128, DType::kF32},
      {"chunk_plain", 32, 32, 128, 128, DType::kBF16}, {"chunk_f16", 32, 32, 128, 128, DType::kF16},
      {"chunk_k100", 32, 32, 100, 100, DType::kF32},
  };
  std::vector<BenchRow> rows;
  const std::vector<int64_t> lengths(8, 256);
  std::vector<std::unique_ptr<bench::FlaProblem>> chunk_problems;
  std::vector<std::function<void(int64_t)>> chunk_calls;
  for (const ChunkCase& c : chunk_cases) {
    chunk_problems.push_back(std::make_unique<bench::FlaProblem>(lengths, c.H, c.HV, c.K, c.V, c.dtype));
    bench::FlaProblem& p = *chunk_problems.back();
    chunk_kda(p.chunk, KernelImpl::kOptimized);  // warm-up
    chunk_calls.emplace_back([&p](int64_t) { chunk_kda(p.chunk, KernelImpl::kOptimized); });
  }
  const std::vector<std::vector<double>> chunk_seconds = bench::TimeAlternately(repeats, chunk_calls);
  for (size_t i = 0; i < chunk_problems.size(); ++i) {
    const ChunkCase& c = chunk_cases[i];
    const bench::FlaProblem& p = *chunk_problems[i];
    BenchRow r = Row(m, c.kernel, KernelImpl::kOptimized, DType::kF32, p.N(), p.T(), repeats);
    r.dtype = TorchDTypeName(c.dtype);
    r.H = c.H;
    r.K = c.K;
    r.us_per_token = Median(chunk_seconds[i]) * 1e6 / static_cast<double>(p.T());
    const double floor_us = 7.0 * c.K * c.V * c.HV / (m.fma_peak_gflops * 1e3);
    r.extra = {{"HV", c.HV},
               {"V", c.V},
               {"us_per_value_head", r.us_per_token / c.HV},
               {"flop_floor_us_per_token", floor_us},
               {"ratio_to_flop_floor", r.us_per_token / floor_us}};
    rows.push_back(r);
  }
  chunk_problems.clear();
  // The recurrence: 8 sequences of T tokens; and the verification step of 4 tokens.
  const int64_t recurrent_cases[] = {1, 4, -4};
  std::vector<std::unique_ptr<bench::FlaProblem>> recurrent_problems;
  std::vector<std::function<void(int64_t)>> recurrent_calls;
  for (int64_t t : recurrent_cases) {
    const bool speculative = t < 0;
    recurrent_problems.push_back(std::make_unique<bench::FlaProblem>(std::vector<int64_t>(8, speculative ? -t : t),
                                                                     kHeads, kHeads, kHeadDim, kHeadDim, DType::kBF16));
    RecurrentKdaCall& call =
        speculative ? recurrent_problems.back()->speculative : recurrent_problems.back()->recurrent;
    fused_recurrent_kda(call, KernelImpl::kOptimized);  // warm-up
    recurrent_calls.emplace_back([&call](int64_t) { fused_recurrent_kda(call, KernelImpl::kOptimized); });
  }
  const int steps = std::max(repeats, 5) * 4;
  const std::vector<std::vector<double>> recurrent_seconds = bench::TimeAlternately(steps, recurrent_calls);
  for (size_t i = 0; i < recurrent_problems.size(); ++i) {
    const bench::FlaProblem& p = *recurrent_problems[i];
    const double step_s = Median(recurrent_seconds[i]);
    BenchRow r = Row(m, recurrent_cases[i] < 0 ? "recurrent_spec" : "recurrent_tokens", KernelImpl::kOptimized,
                     DType::kBF16, p.N(), p.T(), steps);
    r.us_per_token = step_s * 1e6 / static_cast<double>(p.T());
    // Each step reads and writes the N states once (at T tokens per sequence, once per sequence).
    const double state_bytes = static_cast<double>(p.N()) * kHeads * kHeadDim * kHeadDim * sizeof(float);
    const double floor_us = state_bytes / (m.rmw_gbps * 1e3);
    r.extra = {{"tokens_per_sequence", static_cast<double>(p.T()) / static_cast<double>(p.N())},
               {"step_us", step_s * 1e6},
               {"rmw_floor_us", floor_us},
               {"ratio_to_rmw_floor", step_s * 1e6 / floor_us}};
    rows.push_back(r);
  }
  return rows;
}

// The steps of `call` over `layers` copies of its state buffer (initial_state: [rows, HV, K, V] each, in
// place), one copy per step in turn, so that every step reads its states from memory as a model's layers do:
// the median step time in seconds over `steps` steps after one pass over the copies.
double StreamedStepSeconds(RecurrentKdaCall call, int layers, int64_t steps) {
  const auto per_layer = static_cast<size_t>(call.initial_state.numel());
  std::vector<float> states = bench::TokenInputs::Random(static_cast<int64_t>(per_layer) * layers, 7, 0.1F);
  const auto step = [&](int64_t i) {
    call.initial_state.data = states.data() + static_cast<size_t>(i % layers) * per_layer;
    fused_recurrent_kda(call, KernelImpl::kOptimized);
  };
  for (int i = 0; i < layers; ++i) step(i);  // warm-up: one pass over the copies
  std::vector<double> t;
  t.reserve(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    const Clock::time_point t0 = Clock::now();
    step(i);
    t.push_back(Seconds(t0));
  }
  return Median(t);
}

// The row of a step of p's sequences through `call` (tokens per sequence each, bf16 tokens; H, HV, K, V its
// heads), its states streamed from memory (StreamedStepSeconds over enough copies of them), against the
// read-write floor: each state read (one per sequence) and written (one per token) at the in-place
// read-modify-write rate, which moves each byte twice: bytes read + written over 2 rmw_gbps.
BenchRow StreamedStepRow(const Machine& m, const char* kernel, const RecurrentKdaCall& call, const bench::FlaProblem& p,
                         std::array<int, 4> heads, int64_t tokens, int repeats) {
  const auto [H, HV, K, V] = heads;
  const auto per_layer = static_cast<int64_t>(call.initial_state.numel() * sizeof(float));
  const int layers = static_cast<int>(std::max<int64_t>(2, (m.stream_bytes + per_layer - 1) / per_layer));
  const int64_t steps = std::max<int64_t>(static_cast<int64_t>(repeats) * layers, 2 * layers);
  const double step_us = StreamedStepSeconds(call, layers, steps) * 1e6;
  const double state_bytes = static_cast<double>(HV) * K * V * sizeof(float);
  const double moved = state_bytes * static_cast<double>(p.N()) * static_cast<double>(1 + tokens);
  const double floor_us = moved / (2.0 * m.rmw_gbps * 1e3);
  BenchRow r = Row(m, kernel, KernelImpl::kOptimized, DType::kBF16, p.N(), p.T(), static_cast<int>(steps));
  r.H = H;
  r.K = K;
  r.us_per_token = step_us / static_cast<double>(p.T());
  r.extra = {{"HV", HV},
             {"V", V},
             {"tokens_per_sequence", static_cast<double>(tokens)},
             {"step_us", step_us},
             {"rmw_gbps", m.rmw_gbps},
             {"rw_floor_us", floor_us},
             {"ratio_to_rw_floor", step_us / floor_us},
             {"streamed_bytes", static_cast<double>(per_layer) * layers}};
  return r;
}

// ------------------------------------------------------------ Mamba2 (SSD)

// Mamba2's SSD scan, the delta-rule kernels without the delta correction, at Granite-4.0-H-Small's mixer
// shapes (one group of B and C, 128 heads of 64, state 128): the prefill of one sequence of 2048 tokens
// (fp32 and bf16 tokens), optimized, against the same run's FMA peak. The flop floor is the plain
// recurrence's two FMAs per state element and token (4 N P flops per head and token). Then a decode step of
// 32 sequences (one bf16 token each, the states [N, H, P, N_state] in place as served), its states streamed
// from memory (StreamedStepSeconds), against the read-write floor: the states' bytes at the in-place
// read-modify-write rate.
std::vector<BenchRow> SsdRows(const Machine& m, int repeats) {
  constexpr int kGroups = 1;
  constexpr int kHeads = 128;
  constexpr int kState = 128;
  constexpr int kHeadDim = 64;
  std::vector<BenchRow> rows;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    bench::FlaProblem p({2048}, kGroups, kHeads, kState, kHeadDim, dtype, 1, /*scalar_gate=*/true);
    p.chunk.use_qk_l2norm_in_kernel = false;
    p.chunk.scale = 1.0F;
    p.chunk.delta_correction = false;
    chunk_kda(p.chunk, KernelImpl::kOptimized);  // warm-up
    std::vector<double> t;
    for (int i = 0; i < repeats; ++i) {
      const Clock::time_point t0 = Clock::now();
      chunk_kda(p.chunk, KernelImpl::kOptimized);
      t.push_back(Seconds(t0));
    }
    const double us = Median(t) * 1e6 / static_cast<double>(p.T());
    const double floor_us = 4.0 * kState * kHeadDim * kHeads / (m.fma_peak_gflops * 1e3);
    BenchRow r = Row(m, "ssd_chunk", KernelImpl::kOptimized, dtype, p.N(), p.T(), repeats);
    r.H = kGroups;
    r.K = kState;
    r.us_per_token = us;
    r.extra = {{"HV", kHeads},
               {"V", kHeadDim},
               {"fma_peak_gflops", m.fma_peak_gflops},
               {"flop_floor_us_per_token", floor_us},
               {"ratio_to_flop_floor", us / floor_us}};
    rows.push_back(r);
  }
  // Chunked prefill as served: 8 sequences of 256 tokens with initial and final states [N, H, P, N_state]
  // (V-first), timed alternately against the same call with K-major states.
  {
    std::vector<std::unique_ptr<bench::FlaProblem>> problems;
    std::vector<std::function<void(int64_t)>> calls;
    for (bool v_first : {true, false}) {
      problems.push_back(std::make_unique<bench::FlaProblem>(std::vector<int64_t>(8, 256), kGroups, kHeads, kState,
                                                             kHeadDim, DType::kBF16, 1, /*scalar_gate=*/true));
      ChunkKdaCall& c = problems.back()->chunk;
      c.use_qk_l2norm_in_kernel = false;
      c.scale = 1.0F;
      c.delta_correction = false;
      c.state_v_first = v_first;
      if (v_first) {
        std::swap(c.initial_state.shape[2], c.initial_state.shape[3]);
        std::swap(c.final_state.shape[2], c.final_state.shape[3]);
      }
      chunk_kda(c, KernelImpl::kOptimized);  // warm-up
      calls.emplace_back([&c](int64_t) { chunk_kda(c, KernelImpl::kOptimized); });
    }
    const std::vector<std::vector<double>> seconds = bench::TimeAlternately(repeats, calls);
    const double us = Median(seconds[0]) * 1e6 / static_cast<double>(problems[0]->T());
    const double k_major_us = Median(seconds[1]) * 1e6 / static_cast<double>(problems[1]->T());
    BenchRow r =
        Row(m, "ssd_chunk_states", KernelImpl::kOptimized, DType::kBF16, problems[0]->N(), problems[0]->T(), repeats);
    r.H = kGroups;
    r.K = kState;
    r.us_per_token = us;
    r.extra = {
        {"HV", kHeads}, {"V", kHeadDim}, {"k_major_us_per_token", k_major_us}, {"ratio_to_k_major", us / k_major_us}};
    rows.push_back(r);
  }
  constexpr int64_t kSequences = 32;
  bench::FlaProblem p(std::vector<int64_t>(kSequences, 1), kGroups, kHeads, kState, kHeadDim, DType::kBF16, 1,
                      /*scalar_gate=*/true);
  RecurrentKdaCall& call = p.recurrent;
  call.use_qk_l2norm_in_kernel = false;
  call.scale = 1.0F;
  call.delta_correction = false;
  call.state_v_first = true;  // [N, H, P, N_state]: the last two dims swap
  std::swap(call.initial_state.shape[2], call.initial_state.shape[3]);
  rows.push_back(StreamedStepRow(m, "ssd_recurrent", call, p, {kGroups, kHeads, kState, kHeadDim}, 1, repeats));
  return rows;
}

// ------------------------------------------------------------ Gated DeltaNet

// Qwen3-Next's linear layers (delta-rule-family.md §2): 16 key heads, 32 value heads, K = V = 128.
constexpr int kGdnKeyHeads = 16;
constexpr int kGdnValueHeads = 32;
constexpr int kGdnHeadDim = 128;

// Gated DeltaNet (a gate per value head, g [T, HV]) at Qwen3-Next's shapes, optimized kernels, each against
// the same run's floors:
// - the prefill of one sequence of 2048 tokens (fp32 and bf16), beside KDA at the same H, HV, K, V (a gate
//   per key dimension) and GDN with three value heads per key head (16 / 48, Qwen3.5-27B), the three timed
//   alternately; the flop floor is the recurrence's 7 K V flops per token and value head, as KDA's rows;
// - a decode step of 32 sequences (one token each, bf16 tokens, the states in place) and a speculative
//   verification step of 8 sequences of 4 tokens (a pool slot per token through 2-D indices), their states
//   streamed from memory (StreamedStepSeconds). The read-write floor moves each state read (one per
//   sequence) and written (one per token) at the in-place read-modify-write rate, which moves each byte
//   twice: bytes read + written over 2 rmw_gbps (a decode step: its states' bytes over rmw_gbps).
std::vector<BenchRow> GdnRows(const Machine& m, int repeats) {
  struct ChunkCase {
    const char* kernel;
    int HV;
    bool scalar_gate;
  };
  const ChunkCase chunk_cases[] = {
      {"gdn_chunk", kGdnValueHeads, true},
      {"kda_chunk", kGdnValueHeads, false},
      {"gdn_chunk_gva3", 3 * kGdnKeyHeads, true},
  };
  constexpr int kh = kGdnKeyHeads;
  constexpr int kd = kGdnHeadDim;
  std::vector<BenchRow> rows;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<std::unique_ptr<bench::FlaProblem>> problems;
    std::vector<std::function<void(int64_t)>> calls;
    for (const ChunkCase& c : chunk_cases) {
      problems.push_back(
          std::make_unique<bench::FlaProblem>(std::vector<int64_t>{2048}, kh, c.HV, kd, kd, dtype, 1, c.scalar_gate));
      bench::FlaProblem& p = *problems.back();
      chunk_kda(p.chunk, KernelImpl::kOptimized);  // warm-up
      calls.emplace_back([&p](int64_t) { chunk_kda(p.chunk, KernelImpl::kOptimized); });
    }
    const std::vector<std::vector<double>> seconds = bench::TimeAlternately(repeats, calls);
    std::vector<double> us(std::size(chunk_cases));
    for (size_t i = 0; i < us.size(); ++i) us[i] = Median(seconds[i]) * 1e6 / static_cast<double>(problems[i]->T());
    for (size_t i = 0; i < us.size(); ++i) {
      const ChunkCase& c = chunk_cases[i];
      BenchRow r = Row(m, c.kernel, KernelImpl::kOptimized, dtype, problems[i]->N(), problems[i]->T(), repeats);
      r.H = kh;
      r.K = kd;
      r.us_per_token = us[i];
      const double floor_us = 7.0 * kd * kd * c.HV / (m.fma_peak_gflops * 1e3);
      const double best_us =
          *std::min_element(seconds[i].begin(), seconds[i].end()) * 1e6 / static_cast<double>(problems[i]->T());
      r.extra = {{"HV", c.HV},
                 {"V", kd},
                 {"us_per_value_head", us[i] / c.HV},
                 {"fma_peak_gflops", m.fma_peak_gflops},
                 {"flop_floor_us_per_token", floor_us},
                 {"ratio_to_flop_floor", us[i] / floor_us},
                 {"best_us_per_token", best_us},
                 {"best_ratio_to_flop_floor", best_us / floor_us}};
      if (i == 0) r.extra.emplace_back("ratio_to_kda_chunk", us[0] / us[1]);
      if (i == 2) r.extra.emplace_back("per_value_head_ratio_to_gva2", (us[2] / c.HV) / (us[0] / kGdnValueHeads));
      rows.push_back(r);
    }
  }
  // Decode and speculative verification, states streamed.
  struct StepCase {
    const char* kernel;
    int64_t sequences, tokens;
  };
  for (const StepCase& c : {StepCase{"gdn_recurrent", 32, 1}, StepCase{"gdn_recurrent_spec", 8, 4}}) {
    bench::FlaProblem p(std::vector<int64_t>(static_cast<size_t>(c.sequences), c.tokens), kh, kGdnValueHeads, kd, kd,
                        DType::kBF16, 1, true);
    const bool speculative = c.tokens > 1;
    const RecurrentKdaCall& call = speculative ? p.speculative : p.recurrent;
    rows.push_back(StreamedStepRow(m, c.kernel, call, p, {kh, kGdnValueHeads, kd, kd}, c.tokens, repeats));
  }
  return rows;
}

}  // namespace

CLI::App* AddBenchKernelsCommand(CLI::App& app, BenchKernelsOptions& opt) {
  CLI::App* cmd = app.add_subcommand(
      "bench-kernels",
      "KDA core kernels (chunk prefill, recurrent decode), reference vs optimized, vs machine ceilings");
  cmd->add_flag("--json", opt.json, "One JSON object per line per measurement");
  cmd->add_option("--threads", opt.threads, "Worker threads (0: OpenMP default)");
  cmd->add_option("--repeats", opt.repeats, "Timed runs per measurement (median; the reference chunk kernel: R/3)");
  cmd->add_option("--only", opt.only, "Row groups to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(
          {"chunk", "recurrent", "layer", "decode", "projections", "options", "gdn", "gdn_layer", "ssd", "ssd_layer"}));
  return cmd;
}

int RunBenchKernelsCommand(const BenchKernelsOptions& opt) {
  Check(opt.threads >= 0, "--threads must be >= 0, got " + std::to_string(opt.threads));
  Check(opt.repeats >= 1, "--repeats must be >= 1, got " + std::to_string(opt.repeats));
  SetNumThreads(opt.threads);
  Machine m;
  m.threads = NumThreads();
  m.fma_peak_gflops = MeasurePeakGflops(m.threads, opt.repeats, ProbeInstruction::kFma);
  m.bf16_dot_gflops = MeasurePeakGflops(m.threads, opt.repeats, ProbeInstruction::kBf16Dot);
  m.amx_bf16_gflops = MeasurePeakGflops(m.threads, opt.repeats, ProbeInstruction::kAmxBf16);
  m.amx_int8_gops = MeasurePeakGflops(m.threads, opt.repeats, ProbeInstruction::kAmxInt8);
  m.copy_gbps = MeasureCopyGbps(m.threads, opt.repeats);
  m.rmw_gbps = MeasureReadWriteGbps(m.threads, opt.repeats, opt.repeats > 0 ? 1.0F : 0.5F);
  m.llc_bytes = bench::LastLevelCacheBytes();
  m.stream_bytes = bench::DecodeStreamBytes();
  m.read_gbps = MeasureReadGbps(m.threads, opt.repeats, m.stream_bytes);
  PrintHeader(m, opt.json);
  const auto run = [&](const char* group) {
    return opt.only.empty() || std::find(opt.only.begin(), opt.only.end(), group) != opt.only.end();
  };

  // The reference chunk kernel takes ~1 ms per token at these shapes: fewer runs.
  const int reference_repeats = (opt.repeats + 2) / 3;
  const std::vector<std::vector<int64_t>> prefill = {{2048}, std::vector<int64_t>(8, 256)};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    if (!run("chunk")) break;
    for (const std::vector<int64_t>& lengths : prefill) {
      for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
        PrintRow(ChunkRow(m, impl, dtype, lengths, impl == KernelImpl::kReference ? reference_repeats : opt.repeats),
                 opt.json);
      }
    }
  }
  for (int64_t n : {1, 8, 32}) {
    if (!run("recurrent")) break;
    for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
      PrintRow(RecurrentRow(m, impl, n, opt.repeats), opt.json);
    }
  }
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    if (!run("layer")) break;
    PrintRow(LayerRow(m, "kimi_linear", KernelImpl::kOptimized, dtype, 1, 2048, opt.repeats), opt.json);
  }
  for (int64_t n : {1, 8}) {
    if (!run("decode")) break;
    for (const BenchRow& r : LayerDecodeRows(m, "kimi_linear", n, opt.repeats)) PrintRow(r, opt.json);
  }
  // The Gated DeltaNet layer at Qwen3-Next-80B's shapes: prefill against its GEMMs, batch-1 decode.
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    if (!run("gdn_layer")) break;
    PrintRow(LayerRow(m, "qwen3_next", KernelImpl::kOptimized, dtype, 1, 2048, opt.repeats), opt.json);
  }
  if (run("gdn_layer")) {
    for (const BenchRow& r : LayerDecodeRows(m, "qwen3_next", 1, opt.repeats)) PrintRow(r, opt.json);
  }
  for (int64_t rows : {1, 8, 64, 2048}) {
    if (!run("projections")) break;
    for (const BenchRow& r : ProjectionRows(m, rows, opt.repeats)) PrintRow(r, opt.json);
  }
  if (run("options")) {
    for (const BenchRow& r : FlaOptionRows(m, opt.repeats)) PrintRow(r, opt.json);
  }
  if (run("gdn")) {
    for (const BenchRow& r : GdnRows(m, opt.repeats)) PrintRow(r, opt.json);
  }
  // Mamba2 at Granite-4.0-H-Small's mixer shapes: the SSD scan, the layer's prefill against its GEMMs, decode.
  if (run("ssd")) {
    for (const BenchRow& r : SsdRows(m, opt.repeats)) PrintRow(r, opt.json);
  }
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    if (!run("ssd_layer")) break;
    PrintRow(LayerRow(m, "granitemoehybrid", KernelImpl::kOptimized, dtype, 1, 2048, opt.repeats), opt.json);
  }
  if (run("ssd_layer")) {
    for (const BenchRow& r : LayerDecodeRows(m, "granitemoehybrid", 1, opt.repeats)) PrintRow(r, opt.json);
  }
  return 0;
}

}  // namespace kda::cli
