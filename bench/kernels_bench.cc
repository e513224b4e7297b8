// Google Benchmark programs of the KDA core kernels and the whole layer at
// the real shapes (hidden 2304, H = 32, K = V = 128), reference vs optimized:
//   BM_ChunkKda/<impl>/<dtype>/<batch>: chunk_kda prefill, one sequence of
//     2048 tokens (batch 0) or 8 packed sequences of 256 (batch 1);
//     counter time_per_token (seconds, printed with an SI prefix: "21.3u").
//     The reference takes ~1 ms per token here: one call per repetition.
//     The optimized kernel runs once untimed first, then several calls per
//     repetition.
//   BM_ChunkKdaGateInKernel: the optimized chunk kernel, bf16, T = 2048, with
//     the forget gate activated inside it (use_gate_in_kernel).
//   BM_ChunkKdaIntermediateStates/<dtype>: the optimized chunk kernel, T = 2048,
//     returning the state at the start of every chunk of 64 tokens
//     (return_intermediate_states, fla's h: 32 x [H, K, V] in the dtype).
//   BM_RecurrentKda/<impl>/<N>: one fused_recurrent_kda decode step of N
//     sequences, states cycling over bench::DecodeStreamBytes() of buffers (twice the last-level cache, at least 256
//     MiB; as over a model's layers) so that they come from memory; counter time_per_token (step time / N).
//   BM_RecurrentKdaTokens/<tokens>/<N>/<writes>: the optimized
//     fused_recurrent_kda over N sequences of `tokens` tokens each (a
//     speculative verify step's 1 + k positions), states from memory as in
//     BM_RecurrentKda, writing the final states back into them (writes 1,
//     as a commit) or no state at all (writes 0, as the verify step);
//     counter time_per_token (step time / (N tokens)).
//   BM_ShortConv/<impl>: the layer's q, k and v short convs + SiLU (bf16, one
//     sequence of 2048 tokens, 3 x 4096 channels read from the fused q/k/v
//     projection rows, width 4), as the backend calls them; counter
//     time_per_token.
//   BM_KdaLayer/<dtype>/<part>: one KimiDeltaAttention prefill of 2048
//     tokens (part 0) or its projection GEMMs alone (part 1), optimized
//     kernels; counter time_per_token. The layer over the GEMMs is the ratio
//     `kda bench-kernels` reports.
//   BM_Linear/<weights>/<M>: one projection of M rows (decode batches of 1
//     and 8, a k = 3 verify step's 4, prefill chunks of 64 and 512 tokens; the small-M kernels up to
//     16 rows, oneDNN above), fused q/k/v shape (12288 x 2304), bf16 (weights
//     0), int8 with bf16 activations (weights 1) or fp32 (weights 2) weights,
//     cycling over copies spanning bench::DecodeStreamBytes() so that the
//     weights come from memory; an iteration is one product. The bf16
//     pipeline takes the GEMM route KDA_GEMM_ROUTE names (label).
//   BM_DecodeLayer/<weights>/<N>: one DECODE step of the whole layer, bf16
//     activations, at batch N, with bf16 (weights 0) or int8 (weights 1)
//     projection weights, the layers cycling over bench::DecodeStreamBytes() of weights so that
//     each step streams its layer's weights and states from memory; an
//     iteration is one step.
// impl: 0 = reference, 1 = optimized (the CPU's best ISA variant, or KDA_ISA);
// dtype: 0 = float32, 1 = bfloat16.
// Example: ./build/kda_bench --benchmark_filter='Chunk.*/impl:1/' --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/bench/cache.h"
#include "kda/bench/kernel_problems.h"
#include "kda/bench/layer_problem.h"
#include "kda/kernels/gemm_route.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/linear.h"
#include "kda/kernels/q8.h"
#include "kda/kernels/short_conv.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/layer_family.h"

namespace kda {
namespace {

// Kimi-Linear-48B-A3B's KDA layer (the family's reference geometry).
const DeltaRuleGeometry kShape = LayerFamilyFor("kimi_linear").reference;
const int kHeads = kShape.H;
const int kHeadDim = kShape.K;

KernelImpl ImplArg(int64_t x) { return x == 0 ? KernelImpl::kReference : KernelImpl::kOptimized; }

// The counter time_per_token: an iteration's time over its `tokens`.
void SetTimePerToken(benchmark::State& state, int64_t tokens) {
  state.counters["time_per_token"] = benchmark::Counter(
      static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Times chunk_kda on the problem's call with `impl` (the optimized kernel runs once untimed first: scratch and first
// touches); counter time_per_token.
void TimeChunk(benchmark::State& state, const bench::ChunkProblem& p, KernelImpl impl) {
  state.SetLabel(ActiveKernelDescription(impl));
  if (impl == KernelImpl::kOptimized) chunk_kda(p.call, impl);
  for (auto _ : state) chunk_kda(p.call, impl);  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
  SetTimePerToken(state, p.T());
}

// Times fused_recurrent_kda with `impl` on the problem's steps (their states cycling over its buffers);
// counter time_per_token over a step's `tokens`.
void TimeRecurrent(benchmark::State& state, bench::DecodeProblem& p, KernelImpl impl, int64_t tokens) {
  state.SetLabel(ActiveKernelDescription(impl));
  int64_t step = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
    fused_recurrent_kda(p.Step(step++), impl);
  }
  SetTimePerToken(state, tokens);
}

void BM_ChunkKda(benchmark::State& state) {
  const KernelImpl impl = ImplArg(state.range(0));
  const DType dtype = state.range(1) == 0 ? DType::kF32 : DType::kBF16;
  const std::vector<int64_t> lengths = state.range(2) == 0 ? std::vector<int64_t>{2048} : std::vector<int64_t>(8, 256);
  bench::ChunkProblem p(lengths, kHeads, kHeadDim, dtype);
  TimeChunk(state, p, impl);
}

void BM_RecurrentKda(benchmark::State& state) {
  const KernelImpl impl = ImplArg(state.range(0));
  const int64_t n = state.range(1);
  const int layers = bench::DecodeProblem::LayersFor(n, kHeads, kHeadDim, bench::DecodeStreamBytes());
  bench::DecodeProblem p(n, kHeads, kHeadDim, layers, DType::kF32);
  TimeRecurrent(state, p, impl, n);
}

void BM_RecurrentKdaTokens(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t n = state.range(1);
  const int layers = bench::DecodeProblem::LayersFor(n, kHeads, kHeadDim, bench::DecodeStreamBytes());
  bench::DecodeProblem p(n, kHeads, kHeadDim, layers, DType::kBF16, 1, tokens);
  p.call.inplace_final_state = state.range(2) != 0;
  TimeRecurrent(state, p, KernelImpl::kOptimized, n * tokens);
}

// The optimized chunk kernel with the gate activated inside it
// (use_gate_in_kernel: raw gates, A_log, dt_bias), bf16, one sequence of 2048.
void BM_ChunkKdaGateInKernel(benchmark::State& state) {
  bench::ChunkProblem p({2048}, kHeads, kHeadDim, DType::kBF16);
  const std::vector<float> a_log(kHeads, 0.5F);
  const std::vector<float> dt_bias(static_cast<size_t>(kHeads) * kHeadDim, 0.1F);
  p.call.use_gate_in_kernel = true;
  p.call.A_log = ContiguousView<const void*>(a_log.data(), DType::kF32, {kHeads});
  p.call.dt_bias = ContiguousView<const void*>(dt_bias.data(), DType::kF32, {kHeads, kHeadDim});
  TimeChunk(state, p, KernelImpl::kOptimized);
}

// The optimized chunk kernel with fla's h (return_intermediate_states), one sequence of 2048.
void BM_ChunkKdaIntermediateStates(benchmark::State& state) {
  const DType dtype = state.range(0) == 0 ? DType::kF32 : DType::kBF16;
  bench::ChunkProblem p({2048}, kHeads, kHeadDim, dtype);
  const int64_t nt = p.T() / p.call.chunk_size;
  bench::TypedBuffer h(std::vector<float>(static_cast<size_t>(nt) * kHeads * kHeadDim * kHeadDim, 0.0F), dtype);
  p.call.return_intermediate_states = true;
  p.call.intermediate_states = h.MutView({1, nt, kHeads, kHeadDim, kHeadDim});
  TimeChunk(state, p, KernelImpl::kOptimized);
}

void BM_ShortConv(benchmark::State& state) {
  const bool reference = state.range(0) == 0;
  const int64_t T = 2048;
  const int64_t p = kShape.key_dim();
  const int W = kShape.W;
  const std::vector<float> x_values = bench::TokenInputs::Random(T * 3 * p, 7, 1.0F);
  const bench::TypedBuffer x(x_values, DType::kBF16);
  bench::TypedBuffer y(std::vector<float>(static_cast<size_t>(T * 3 * p), 0.0F), DType::kBF16);
  bench::TypedBuffer tails(std::vector<float>(static_cast<size_t>((W - 1) * 3 * p), 0.0F), DType::kBF16);
  const std::vector<float> weight = bench::TokenInputs::Random(3 * p * W, 8, 0.5F);
  const std::vector<int64_t> cu = {0, T};
  const std::vector<int32_t> tail_index = {0};
  const std::vector<uint8_t> has_initial_state = {0};
  auto run = [&] {
    for (int group = 0; group < 3; ++group) {
      ShortConvArgs a;
      a.y = {static_cast<BF16*>(y.Mut().data) + group * T * p, DType::kBF16};
      a.x = {static_cast<const BF16*>(x.Const().data) + group * p, DType::kBF16};
      a.x_row_stride = 3 * p;
      a.weight = weight.data() + group * W * p;  // [3][W][P], as the layer holds it
      a.cu_seqlens = cu.data();
      a.N = 1;
      a.T = T;
      a.C = p;
      a.W = W;
      a.tails = {static_cast<BF16*>(tails.Mut().data) + group * p, DType::kBF16};
      a.tail_row_stride = 3 * p;
      a.num_tails = 1;
      a.tail_indices = tail_index.data();
      a.has_initial_state = has_initial_state.data();
      if (reference) {
        short_conv_silu_reference(a);
      } else {
        short_conv_silu(a);
      }
    }
  };
  run();                       // warm-up
  for (auto _ : state) run();  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
  SetTimePerToken(state, T);
}

void BM_KdaLayer(benchmark::State& state) {
  const DType dtype = state.range(0) == 0 ? DType::kF32 : DType::kBF16;
  const bool gemms_only = state.range(1) != 0;
  bench::LayerProblem p("kimi_linear", dtype, KernelImpl::kOptimized, kShape, 1, 2048);
  state.SetLabel(ActiveKernelDescription(KernelImpl::kOptimized));
  p.Forward();  // warm-up: GEMM primitives, scratch
  p.Gemms();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
    if (gemms_only) {
      p.Gemms();
    } else {
      p.Forward();
    }
  }
  SetTimePerToken(state, p.tokens);
}

// One projection (the fused q/k/v shape) at M rows: dense bf16, Q8 (bf16
// activations) or dense fp32 weights, copies cycled past the last-level cache.
// The bf16 pipeline's route follows KDA_GEMM_ROUTE.
void BM_Linear(benchmark::State& state) {
  const int64_t weights = state.range(0);  // 0 bf16, 1 int8, 2 fp32
  const int64_t m = state.range(1);
  const DType dtype = weights == 2 ? DType::kF32 : DType::kBF16;
  constexpr int64_t kOut = 3 * 4096;
  const int64_t in = kShape.hidden;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0F, 0.02F);
  std::vector<float> w(static_cast<size_t>(kOut * in));
  for (float& v : w) v = normal(rng);
  const int64_t bytes = weights == 1 ? kOut * in * 17 / 16 : kOut * in * static_cast<int64_t>(DTypeSize(dtype));
  std::vector<Linear> copies;
  for (int64_t i = 0; i < std::max<int64_t>(2, (bench::DecodeStreamBytes() + bytes - 1) / bytes); ++i) {
    copies.push_back(weights == 1 ? Linear(QuantizeQ8(w, kOut, in), dtype) : Linear(w, kOut, in, dtype));
  }
  std::vector<float> x(static_cast<size_t>(m * in));
  for (float& v : x) v = RoundBF16(normal(rng));
  std::vector<BF16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = ToBF16(x[i]);
  std::vector<float> y(static_cast<size_t>(m * kOut));
  const ConstBuf src = dtype == DType::kF32 ? ConstBuf{x.data(), DType::kF32} : ConstBuf{xb.data(), DType::kBF16};
  const MutBuf dst{y.data(), DType::kF32};
  state.SetLabel(std::string(ActiveKernelDescription(KernelImpl::kOptimized)) + " " +
                 GemmRouteName(PipelineGemmPlan(dtype).ForRows(m)));
  for (const Linear& l : copies) l.Forward(dst, src, m);  // warm-up
  size_t i = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
    copies[i++ % copies.size()].Forward(dst, src, m);
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["flops"] =
      benchmark::Counter(2.0 * static_cast<double>(m * kOut * in), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DecodeLayer(benchmark::State& state) {
  const WeightFormat weights = state.range(0) == 0 ? WeightFormat::kDense : WeightFormat::kInt8;
  const int64_t n = state.range(1);
  const int64_t layer_bytes = bench::LayerProjectionBytes("kimi_linear", DType::kBF16, weights, kShape);
  bench::LayerDecodeProblem p("kimi_linear", DType::kBF16, weights, kShape, n,
                              bench::LayerDecodeProblem::LayersFor(layer_bytes, bench::DecodeStreamBytes()));
  state.SetLabel(ActiveKernelDescription(KernelImpl::kOptimized));
  for (int i = 0; i < p.model.num_layers(); ++i) p.Step(i);  // warm-up: one pass over the layers
  int64_t step = 0;
  for (auto _ : state) p.Step(step++);  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
}

// Wall-clock timing, at least a second per repetition, the medians (and
// spread) of three repetitions reported.
void MillisecondsAggregated(benchmark::internal::Benchmark* b) {
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0)->Repetitions(3)->ReportAggregatesOnly(true);
}
void MicrosecondsAggregated(benchmark::internal::Benchmark* b) {
  MillisecondsAggregated(b);
  b->Unit(benchmark::kMicrosecond);
}

void ChunkArgs(benchmark::internal::Benchmark* b, int64_t impl) {
  b->ArgNames({"impl", "dtype", "batch"});
  for (int64_t dtype : {0, 1}) {
    for (int64_t batch : {0, 1}) b->Args({impl, dtype, batch});
  }
}

}  // namespace

// The reference chunk kernel at these shapes takes seconds per call: one iteration per repetition.
BENCHMARK(BM_ChunkKda)
    ->Apply([](benchmark::internal::Benchmark* b) { ChunkArgs(b, 0); })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime()
    ->Iterations(1)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_ChunkKda)
    ->Apply([](benchmark::internal::Benchmark* b) { ChunkArgs(b, 1); })
    ->Apply(MillisecondsAggregated)
    ->MeasureProcessCPUTime();
BENCHMARK(BM_ChunkKdaGateInKernel)->Apply(MillisecondsAggregated);
BENCHMARK(BM_ChunkKdaIntermediateStates)->ArgNames({"dtype"})->Arg(0)->Arg(1)->Apply(MillisecondsAggregated);
BENCHMARK(BM_RecurrentKda)
    ->ArgNames({"impl", "N"})
    ->ArgsProduct({{0, 1}, {1, 8, 32}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_RecurrentKdaTokens)
    ->ArgNames({"tokens", "N", "writes"})
    ->ArgsProduct({{1, 4, 8}, {1, 8}, {0, 1}})
    ->Apply(MicrosecondsAggregated);
BENCHMARK(BM_ShortConv)->ArgNames({"impl"})->Arg(0)->Arg(1)->Apply(MillisecondsAggregated);
BENCHMARK(BM_Linear)
    ->ArgNames({"weights", "M"})
    ->ArgsProduct({{0, 1, 2}, {1, 4, 8, 64, 512}})
    ->Apply(MicrosecondsAggregated);
BENCHMARK(BM_DecodeLayer)->ArgNames({"weights", "N"})->ArgsProduct({{0, 1}, {1, 8}})->Apply(MicrosecondsAggregated);
BENCHMARK(BM_KdaLayer)->ArgNames({"dtype", "gemms_only"})->ArgsProduct({{0, 1}, {0, 1}})->Apply(MillisecondsAggregated);

}  // namespace kda

BENCHMARK_MAIN();
