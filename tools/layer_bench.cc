#include "tools/layer_bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/kda_layer_problem.h"
#include "kda/base/error.h"

namespace kda::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
double TimeUs(const Fn& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LayerBenchResult BenchLayer(DType dtype, KernelImpl kernel, int64_t hidden, int H, int K, int W, int64_t N, int64_t T,
                            int repeats) {
  Check(repeats >= 1, "layer bench: need repeats >= 1");
  bench::LayerProblem p(dtype, kernel, hidden, H, K, W, N, T);
  p.Forward();  // warm-up: primitive creation, page faults
  p.Gemms();
  std::vector<double> layer_us;
  std::vector<double> gemm_us;
  // Interleaved, so that a slow spell of the machine hits both.
  for (int r = 0; r < repeats; ++r) {
    layer_us.push_back(TimeUs([&] { p.Forward(); }));
    gemm_us.push_back(TimeUs([&] { p.Gemms(); }));
  }
  LayerBenchResult res;
  res.us_per_token = Median(layer_us) / static_cast<double>(T);
  res.gemm_us_per_token = Median(gemm_us) / static_cast<double>(T);
  return res;
}

}  // namespace kda::cli
