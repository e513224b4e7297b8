// Google Benchmark programs of the KDA core kernels at the real shapes
// (H = 32, K = V = 128), reference vs optimized:
//   BM_ChunkKda/<impl>/<dtype>/<batch>: chunk_kda prefill, one sequence of
//     2048 tokens (batch 0) or 8 packed sequences of 256 (batch 1);
//     counter time_per_token (seconds, printed with an SI prefix: "21.3u").
//   BM_RecurrentKda/<impl>/<N>: one fused_recurrent_kda decode step of N
//     sequences, states cycling over >= 256 MiB of buffers (as over a
//     model's layers) so that they come from memory; counter time_per_token
//     (step time / N).
// impl: 0 = reference, 1 = optimized (the CPU's best ISA variant, or KDA_ISA);
// dtype: 0 = float32, 1 = bfloat16. The reference chunk kernel takes ~1 ms per
// token here: it runs one iteration per repetition.
// Example: ./build/kda_bench --benchmark_filter='Chunk.*/1/' --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "bench/kda_kernel_problems.h"
#include "kda/base/dtype.h"
#include "kda/kernels/kda.h"

namespace kda {
namespace {

constexpr int kHeads = 32;
constexpr int kHeadDim = 128;

KernelImpl ImplArg(int64_t x) { return x == 0 ? KernelImpl::kReference : KernelImpl::kOptimized; }

void BM_ChunkKda(benchmark::State& state) {
  const KernelImpl impl = ImplArg(state.range(0));
  const DType dtype = state.range(1) == 0 ? DType::kF32 : DType::kBF16;
  const std::vector<int64_t> lengths = state.range(2) == 0 ? std::vector<int64_t>{2048} : std::vector<int64_t>(8, 256);
  bench::ChunkProblem p(lengths, kHeads, kHeadDim, dtype);
  state.SetLabel(ActiveKernelDescription(impl));
  for (auto _ : state) chunk_kda(p.args, impl);  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
  state.counters["time_per_token"] = benchmark::Counter(
      static_cast<double>(p.args.T), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_RecurrentKda(benchmark::State& state) {
  const KernelImpl impl = ImplArg(state.range(0));
  const int64_t n = state.range(1);
  const int layers = bench::DecodeProblem::LayersFor(n, kHeads, kHeadDim, int64_t{256} << 20);
  bench::DecodeProblem p(n, kHeads, kHeadDim, layers, DType::kF32);
  state.SetLabel(ActiveKernelDescription(impl));
  int64_t step = 0;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): the benchmark idiom
    fused_recurrent_kda(p.Step(step++), impl);
  }
  state.counters["time_per_token"] = benchmark::Counter(
      static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void ChunkArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"impl", "dtype", "batch"});
  for (int64_t impl : {0, 1}) {
    for (int64_t dtype : {0, 1}) {
      for (int64_t batch : {0, 1}) b->Args({impl, dtype, batch});
    }
  }
}

}  // namespace

// The reference chunk kernel at these shapes takes seconds per call: one iteration per repetition.
BENCHMARK(BM_ChunkKda)
    ->Apply(ChunkArgs)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime()
    ->Iterations(1)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_RecurrentKda)
    ->ArgNames({"impl", "N"})
    ->ArgsProduct({{0, 1}, {1, 8, 32}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MinTime(0.5);

}  // namespace kda

BENCHMARK_MAIN();
