// Linear (kda/kernels/linear.h) over every GEMM route (kda/kernels/gemm_route.h)
// in every ISA this CPU runs: dense fp32 and bf16 weights and Q8 weights, the
// small-M kernels and the GEMM library (Q8 and widened bf16 weights in panels
// of output rows), against plain references; and the route switch itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/base/tolerance.h"
#include "kda/kernels/cpu_probe.h"
#include "kda/kernels/gemm_route.h"
#include "kda/kernels/kernel_isa.h"
#include "kda/kernels/linear.h"
#include "kda/kernels/q8.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/kda/kda_dispatch_testing.h"
#include "tests/error_util.h"
#include "tests/kernel_matrix.h"
#include "tests/thread_scope.h"

namespace kda {
namespace {

using testing::ExpectErrorContaining;

// A kernel ISA and a GEMM route that runs under it.
struct RouteCase {
  KernelIsa isa = KernelIsa::kAuto;
  GemmRoute route = GemmRoute::kF32Fma;
};

std::string RouteCaseName(const RouteCase& c) {
  return std::string(KernelIsaName(c.isa)) + "_" + GemmRouteName(c.route);
}

void PrintTo(const RouteCase& c, std::ostream* os) { *os << RouteCaseName(c); }

// Every route the machine can run, in every ISA it runs.
std::vector<RouteCase> SupportedRouteCases() {
  std::vector<RouteCase> r;
  for (KernelIsa isa : testing::SupportedIsas()) {
    SetKernelIsa(isa);
    for (GemmRoute route : {GemmRoute::kF32Fma, GemmRoute::kBf16Dot, GemmRoute::kAmx}) {
      if (CpuSupportsGemmRoute(route)) r.push_back({isa, route});
    }
  }
  internal::ResetKernelIsaForTesting();
  return r;
}

class LinearRouteTest : public ::testing::TestWithParam<RouteCase> {
 protected:
  void SetUp() override {
    SetKernelIsa(GetParam().isa);
    SetGemmRoute(GetParam().route);
  }
  void TearDown() override {
    internal::ResetGemmRouteForTesting();
    internal::ResetKernelIsaForTesting();
  }
};

struct LinearProblem {
  int64_t n, k;
  Q8Weight w;
  std::vector<float> dense;  // dequantized
};

LinearProblem MakeProblem(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0F, 0.02F);
  std::vector<float> w(n * k);
  for (float& v : w) v = RoundBF16(nd(rng));
  LinearProblem p{n, k, {}, {}};
  if (k % kQ8Block == 0) {
    p.w = QuantizeQ8(w, n, k);
    p.dense = DequantizeQ8(p.w);
  } else {
    p.dense = w;
  }
  return p;
}

std::vector<float> Inputs(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0F, 1.0F);
  std::vector<float> x(m * k);
  for (float& v : x) v = RoundBF16(nd(rng));  // bf16-exact: the same inputs for both dtypes
  return x;
}

// Runs the Linear on x (given as fp32, bf16-exact) with `dtype` inputs and outputs; fp32 values back.
std::vector<float> RunLinear(const Linear& l, const std::vector<float>& x, int64_t m, DType dtype) {
  const int64_t n = l.out_features();
  std::vector<float> out(m * n);
  if (dtype == DType::kF32) {
    l.Forward({out.data(), DType::kF32}, {x.data(), DType::kF32}, m);
    return out;
  }
  std::vector<BF16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = ToBF16(x[i]);
  std::vector<BF16> yb(out.size());
  l.Forward({yb.data(), DType::kBF16}, {xb.data(), DType::kBF16}, m);
  for (size_t i = 0; i < out.size(); ++i) out[i] = ToFloat(yb[i]);
  return out;
}

// The plain product in float64 over the weights w [n, k].
std::vector<float> DenseReference(const std::vector<float>& w, const std::vector<float>& x, int64_t m, int64_t n,
                                  int64_t k) {
  std::vector<float> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t c = 0; c < k; ++c) s += static_cast<double>(x[i * k + c]) * w[j * k + c];
      y[i * n + j] = static_cast<float>(s);
    }
  }
  return y;
}

// |y - ref| <= 1e-6 sum |x w| (the fp32 sums differ only in order), plus half
// a bf16 step of the reference for a bf16 output.
void ExpectCloseToReference(const std::vector<float>& y, const std::vector<float>& ref, const LinearProblem& p,
                            const std::vector<float>& x, int64_t m, bool bf16_out, const std::string& what) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < p.n; ++n) {
      double mag = 0.0;
      for (int64_t k = 0; k < p.k; ++k) mag += std::fabs(x[i * p.k + k] * p.dense[n * p.k + k]);
      const double r = ref[i * p.n + n];
      double tol = 1e-6 * mag + 1e-30;
      if (bf16_out) tol += 0.5 * UlpBF16(std::fabs(r));
      ASSERT_LE(std::fabs(y[i * p.n + n] - r), tol) << what << " m " << i << " n " << n;
    }
  }
}

// Row counts around the small-M kernels' tiles (1, 2, 4, 8) and their limit (16).
const std::vector<int64_t> kRowCounts = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 40};

TEST_P(LinearRouteTest, DenseWeightsMatchTheReference) {
  // Output dims with tails of the 4-, 3- and 2-row blocks and of a job; an input
  // dim of 25 blocks (spans of 8 blocks and a tail); input dims that are no
  // multiple of the kernels' block (the GEMM library at every row count).
  for (const auto& [n, k] :
       std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {130, 256}, {3, 32}, {19, 800}, {21, 50}, {5, 7}}) {
    const LinearProblem p = MakeProblem(n, k, static_cast<uint32_t>(n * 1000 + k));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const Linear dense(p.dense, n, k, dtype);
      EXPECT_EQ(dense.weight_bytes(), n * k * static_cast<int64_t>(DTypeSize(dtype)));
      // The weights as the Linear holds them: rounded to bf16 for the bf16 pipeline.
      std::vector<float> held = p.dense;
      if (dtype == DType::kBF16) {
        for (float& v : held) v = RoundBF16(v);
      }
      for (int64_t m : kRowCounts) {
        const std::vector<float> x = Inputs(m, k, static_cast<uint32_t>(m));
        const std::string what = std::string(DTypeName(dtype)) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                                 " m " + std::to_string(m);
        ExpectCloseToReference(RunLinear(dense, x, m, dtype), DenseReference(held, x, m, n, k), p, x, m,
                               dtype == DType::kBF16, what);
      }
    }
  }
}

TEST_P(LinearRouteTest, Bf16WeightsAreRoundedOnceWhateverTheRoute) {
  // 1 + 2^-9 is not a bf16 value: the bf16 Linear holds bf16(w) = 1 and every
  // route multiplies by it; the fp32 Linear keeps w.
  const float w = 1.0F + 0x1p-9F;
  std::vector<float> x(64, 0.0F);
  x[3] = 1.0F;
  for (int64_t m : {1, 17}) {
    std::vector<float> xm;
    for (int64_t i = 0; i < m; ++i) xm.insert(xm.end(), x.begin(), x.end());
    std::vector<float> wv(64, 0.0F);
    wv[3] = w;
    EXPECT_EQ(RunLinear(Linear(wv, 1, 64, DType::kF32), xm, m, DType::kF32)[m - 1], w) << m;
    std::vector<BF16> xb(xm.size());
    for (size_t i = 0; i < xm.size(); ++i) xb[i] = ToBF16(xm[i]);
    std::vector<float> y(m);
    Linear(wv, 1, 64, DType::kBF16).Forward({y.data(), DType::kF32}, {xb.data(), DType::kBF16}, m);
    EXPECT_EQ(y[m - 1], 1.0F) << m;
  }
}

TEST_P(LinearRouteTest, Q8MatchesReferenceAndDenseLinearOnDequantizedWeights) {
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {130, 256}, {3, 32}, {19, 800}}) {
    const LinearProblem p = MakeProblem(n, k, static_cast<uint32_t>(n * 1000 + k));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const bool bf16 = dtype == DType::kBF16;
      const Linear q8(p.w, dtype);
      const Linear dense(p.dense, n, k, dtype);
      EXPECT_EQ(q8.weight_format(), WeightFormat::kInt8);
      EXPECT_EQ(q8.weight_bytes(), n * k + 2 * n * (k / 32));
      for (int64_t m : kRowCounts) {
        const std::vector<float> x = Inputs(m, k, static_cast<uint32_t>(m));
        std::vector<float> ref(m * n);
        Q8LinearReference(ref.data(), x.data(), p.w, m, bf16);
        const std::string what = std::string(DTypeName(dtype)) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                                 " m " + std::to_string(m);
        const std::vector<float> y = RunLinear(q8, x, m, dtype);
        ExpectCloseToReference(y, ref, p, x, m, bf16, what + " vs reference");
        // The small-M kernels and the GEMM library each run the same sums on
        // the same bf16/fp32 weights, Q8 or dense: identical (one tile at
        // these sizes).
        EXPECT_EQ(y, RunLinear(dense, x, m, dtype)) << what;
      }
    }
  }
}

// p's Q8 weights and their dense dequantized copy in Linears of `dtype` at m input rows (Inputs(m, k,
// m)), each against the Q8 reference; the Q8 Linear's outputs. (Not bitwise each other on every
// route: the GEMM library may order the sums over k differently for a tile's column count.)
std::vector<float> ExpectQ8AndDenseNearReference(const LinearProblem& p, DType dtype, int64_t m) {
  const bool bf16 = dtype == DType::kBF16;
  const std::vector<float> x = Inputs(m, p.k, static_cast<uint32_t>(m));
  std::vector<float> ref(m * p.n);
  Q8LinearReference(ref.data(), x.data(), p.w, m, bf16);
  const std::string what = std::string(DTypeName(dtype)) + " m " + std::to_string(m);
  std::vector<float> y = RunLinear(Linear(p.w, dtype), x, m, dtype);
  ExpectCloseToReference(y, ref, p, x, m, bf16, what + " q8");
  ExpectCloseToReference(RunLinear(Linear(p.dense, p.n, p.k, dtype), x, m, dtype), ref, p, x, m, bf16, what + " dense");
  return y;
}

TEST_P(LinearRouteTest, LargeMRunsTheWeightInTilesOfOutputRows) {
  // Above the small-M limit Q8 weights (and bf16 weights on the fp32 FMA
  // route) are dequantized a tile of output rows at a time (a panel of
  // ~1 MiB per thread): with one thread at k = 8192, 32 rows per tile in
  // fp32, 64 in bf16, so 300 rows end in a partial tile either way.
  const testing::ThreadScope one_thread(1);
  const LinearProblem p = MakeProblem(300, 8192, 11);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {17, 33}) ExpectQ8AndDenseNearReference(p, dtype, m);
  }
}

TEST_P(LinearRouteTest, ManyRowsRunInSpansAndOddOutputRowsInPaddedPanels) {
  // On the tiles (kernels/gemm/tile_gemm_simd.cc) more than 64 input rows run
  // in spans (255: four of 64, the last 63; 300 and 530: spans of 60 and 59,
  // rounded to 64), split between the threads where the weight has one job of
  // rows; weight rows run in jobs of 256 and past the last multiple of 32
  // (150 = 128 + 22; 300 = 256 + 44) from a zero-padded panel; an input dim of
  // 320 in two passes (256 and 64 columns) with the accumulators kept between
  // them. Every route gives the reference, and on the tiles each output row is
  // the same whatever the input rows beside it.
  const testing::ThreadScope two_threads(2);
  const bool tiles = GetParam().route == GemmRoute::kAmx && internal::TileGemmRuns();
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{150, 64}, {300, 320}}) {
    const LinearProblem p = MakeProblem(n, k, 5);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t m : {255, 300, 530}) {
        const std::vector<float> y = ExpectQ8AndDenseNearReference(p, dtype, m);
        if (dtype != DType::kBF16 || !tiles) continue;
        // The last 17 rows alone: their outputs bit for bit those of the whole product.
        const std::vector<float> x = Inputs(m, p.k, static_cast<uint32_t>(m));
        const std::vector<float> tail = RunLinear(Linear(p.w, dtype), {x.end() - 17 * p.k, x.end()}, 17, dtype);
        EXPECT_TRUE(std::equal(tail.begin(), tail.end(), y.end() - 17 * p.n)) << m << " " << n;
      }
    }
  }
}

TEST(TileGemmTest, RunsWhereTheTilesAreGrantedAndSaysWhyNotElsewhere) {
  if (!internal::TileGemmRuns()) {
    GTEST_SKIP() << "kda's tile GEMM does not run here: "
                 << (!AmxTilesGranted()                         ? "AMX tiles not granted"
                     : !CanRunProbe(ProbeInstruction::kBf16Dot) ? "AMX tiles granted, but no AVX512-BF16"
                                                                : "AMX tiles granted, but the AVX-512 kernels are not "
                                                                  "active");
  }
  // 1 x 64 times a weight row of 64 ones: the exact sum of the inputs.
  std::vector<BF16> w(64, ToBF16(1.0F));
  std::vector<BF16> x(64);
  float sum = 0.0F;
  for (int i = 0; i < 64; ++i) {
    x[i] = ToBF16(static_cast<float>(i));
    sum += static_cast<float>(i);
  }
  float y = 0.0F;
  internal::TileGemmArgs a;
  a.m = 1;
  a.n = 1;
  a.k = 64;
  a.y_f32 = &y;
  a.ldy = 1;
  internal::TileGemm(a, x.data(), w.data(), nullptr);
  EXPECT_EQ(y, sum);
  a.k = 48;
  ExpectErrorContaining([&] { internal::TileGemm(a, x.data(), w.data(), nullptr); }, "multiple of 32");
}

TEST_P(LinearRouteTest, Bf16PipelineRoundsTheDequantizedWeightToBf16) {
  // d = fp16(100/127) = 0.78759765625 (11 significant bits); 127 d needs 18:
  // bf16(127 d) = 100.0 differs from 127 d = 100.0249. One input 1 at that
  // weight: the fp32 pipeline shows 127 d, the bf16 one bf16(127 d).
  std::vector<float> w(32, 0.0F);
  w[5] = 100.0F;
  const Q8Weight q = QuantizeQ8(w, 1, 32);
  const float exact = HalfBitsToFloat(q.scales[0]) * 127.0F;
  ASSERT_NE(RoundBF16(exact), exact);
  std::vector<float> x(32, 0.0F);
  x[5] = 1.0F;
  for (int64_t m : {1, 17}) {
    std::vector<float> xm;
    for (int64_t i = 0; i < m; ++i) xm.insert(xm.end(), x.begin(), x.end());
    EXPECT_EQ(RunLinear(Linear(q, DType::kF32), xm, m, DType::kF32)[m - 1], exact) << m;
    std::vector<float> y(m);
    // fp32 output of the bf16 pipeline: the sum before its output rounding.
    std::vector<BF16> xb(xm.size());
    for (size_t i = 0; i < xm.size(); ++i) xb[i] = ToBF16(xm[i]);
    Linear(q, DType::kBF16).Forward({y.data(), DType::kF32}, {xb.data(), DType::kBF16}, m);
    EXPECT_EQ(y[m - 1], RoundBF16(exact)) << m;
  }
}

TEST_P(LinearRouteTest, Q8DequantizesEveryValueAtExtremeScalesExactly) {
  // Every int8 value (-127 to 127, eight blocks of 32) at fp16 scales from
  // zero and the smallest subnormal to the largest finite: each output
  // row picks one weight of its row (a one-hot input), so the product is the
  // dequantized weight itself, q * s in fp32 and bf16(q * s) in the bf16
  // pipeline, bit for bit.
  const int64_t k = 256;
  const std::vector<uint16_t> scale_bits = {0x0001, 0x03FF, 0x0400, 0x3C00, 0x3A4D, 0x7BFF, 0x0000, 0x5A3F};
  Q8Weight w;
  w.rows = static_cast<int64_t>(scale_bits.size());
  w.cols = k;
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < k; ++c) w.q.push_back(static_cast<int8_t>((c + r * 37) % 255 - 127));
    for (int64_t b = 0; b < k / kQ8Block; ++b) w.scales.push_back(scale_bits[static_cast<size_t>((r + b) % w.rows)]);
  }
  for (int64_t c = 0; c < k; ++c) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      std::vector<float> x(k, 0.0F);
      x[static_cast<size_t>(c)] = 1.0F;
      std::vector<float> y(static_cast<size_t>(w.rows));
      const Linear lin(w, dtype);
      if (dtype == DType::kBF16) {
        std::vector<BF16> xb(x.size());
        for (size_t i = 0; i < x.size(); ++i) xb[i] = ToBF16(x[i]);
        lin.Forward({y.data(), DType::kF32}, {xb.data(), DType::kBF16}, 1);
      } else {
        lin.Forward({y.data(), DType::kF32}, {x.data(), DType::kF32}, 1);
      }
      for (int64_t r = 0; r < w.rows; ++r) {
        const float s = HalfBitsToFloat(w.scales[static_cast<size_t>(r * (k / kQ8Block) + c / kQ8Block)]);
        const float exact = static_cast<float>(w.q[static_cast<size_t>(r * k + c)]) * s;
        EXPECT_EQ(y[static_cast<size_t>(r)], dtype == DType::kBF16 ? RoundBF16(exact) : exact)
            << DTypeName(dtype) << " row " << r << " column " << c;
      }
    }
  }
}

TEST_P(LinearRouteTest, Bf16PipelineRoundsEveryScaleAndValueToNearestEven) {
  // The bf16 pipeline's Q8 weight is bf16(q * s), rounded in the kernels by
  // a floating-point split (gemm_simd.cc, SplitToBF16), not by the integer
  // rounding of the references: every finite fp16 scale s >= 0 (a row each)
  // times every q in [-127, 127] (row r's column c holds (c + 37 r) mod 255 -
  // 127), read back through one-hot inputs, bit for bit. m = 1 and 16 run the
  // small-M kernels (one column, sampled, and 16 columns per call), m = 256
  // the dequantized panels.
  const int64_t k = 256;
  Q8Weight w;
  w.rows = 0x7C00;  // fp16 bits below +inf
  w.cols = k;
  w.q.reserve(static_cast<size_t>(w.rows * k));
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < k; ++c) w.q.push_back(static_cast<int8_t>((c + r * 37) % 255 - 127));
    for (int64_t b = 0; b < k / kQ8Block; ++b) w.scales.push_back(static_cast<uint16_t>(r));
  }
  const Linear lin(w, DType::kBF16);
  for (int64_t m : {1, 16, 256}) {
    const int64_t step = m == 1 ? 9 : m;  // m = 1: every 9th column (all 255 values over the rows)
    for (int64_t c0 = 0; c0 + m <= k; c0 += step) {
      std::vector<BF16> x(static_cast<size_t>(m * k), ToBF16(0.0F));
      for (int64_t i = 0; i < m; ++i) x[static_cast<size_t>(i * k + c0 + i)] = ToBF16(1.0F);
      std::vector<float> y(static_cast<size_t>(m * w.rows));
      lin.Forward({y.data(), DType::kF32}, {x.data(), DType::kBF16}, m);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < w.rows; ++r) {
          const float exact =
              static_cast<float>(w.q[static_cast<size_t>(r * k + c0 + i)]) * HalfBitsToFloat(static_cast<uint16_t>(r));
          const float got = y[static_cast<size_t>(i * w.rows + r)];
          if (got != RoundBF16(exact)) {
            ADD_FAILURE() << "m " << m << " scale bits " << r << " column " << c0 + i << ": " << got << ", want "
                          << RoundBF16(exact);
            return;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kda, LinearRouteTest, ::testing::ValuesIn(SupportedRouteCases()),
                         [](const ::testing::TestParamInfo<RouteCase>& info) { return RouteCaseName(info.param); });

// ---------------------------------------------------------------- the route switch

// Each case starts from the table's choice, whatever KDA_GEMM_ROUTE the run has.
class GemmRouteSwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("KDA_GEMM_ROUTE");
    internal::ResetGemmRouteForTesting();
  }
  void TearDown() override {
    unsetenv("KDA_GEMM_ROUTE");
    internal::ResetGemmRouteForTesting();
    internal::ResetKernelIsaForTesting();
  }
};

TEST_F(GemmRouteSwitchTest, NamesParseAndUnknownOnesAreAClearError) {
  for (GemmRoute r : {GemmRoute::kAuto, GemmRoute::kBf16Dot, GemmRoute::kF32Fma, GemmRoute::kAmx}) {
    EXPECT_EQ(ParseGemmRoute(GemmRouteName(r)), r);
    EXPECT_EQ(ParseGemmPlan(GemmRouteName(r)), GemmPlan::All(r));
  }
  ExpectErrorContaining([] { ParseGemmRoute("tiles"); },
                        "unknown GEMM route 'tiles' (expected auto, bf16_dot, fp32_fma or amx)");
  const GemmPlan plan{GemmRoute::kBf16Dot, GemmRoute::kAmx, GemmRoute::kF32Fma};
  EXPECT_EQ(GemmPlanName(plan), "decode=bf16_dot,batch=amx,prefill=fp32_fma");
  EXPECT_EQ(ParseGemmPlan(GemmPlanName(plan)), plan);
  EXPECT_EQ(ParseGemmPlan("prefill=amx"), (GemmPlan{GemmRoute::kAuto, GemmRoute::kAuto, GemmRoute::kAmx}));
  ExpectErrorContaining([] { ParseGemmPlan("verify=amx"); },
                        "unknown class of rows 'verify' (expected decode, batch or prefill)");
  ExpectErrorContaining([] { ParseGemmPlan("decode=amx,decode=fp32_fma"); }, "class 'decode' named twice");
  ExpectErrorContaining([] { ParseGemmPlan("decode=amx,fp32_fma"); }, "'fp32_fma' is not CLASS=ROUTE");
  ExpectErrorContaining([] { ParseGemmPlan("batch=fast"); }, "unknown GEMM route 'fast'");
}

TEST_F(GemmRouteSwitchTest, RowCountsFallIntoTheirClasses) {
  EXPECT_EQ(GemmRowsOf(1), GemmRows::kDecode);
  EXPECT_EQ(GemmRowsOf(kGemmDecodeMaxRows), GemmRows::kDecode);
  EXPECT_EQ(GemmRowsOf(kGemmDecodeMaxRows + 1), GemmRows::kBatch);
  EXPECT_EQ(GemmRowsOf(kGemmBatchMaxRows), GemmRows::kBatch);
  EXPECT_EQ(GemmRowsOf(kGemmBatchMaxRows + 1), GemmRows::kPrefill);
  const GemmPlan plan{GemmRoute::kBf16Dot, GemmRoute::kAmx, GemmRoute::kF32Fma};
  EXPECT_EQ(plan.ForRows(8), GemmRoute::kBf16Dot);
  EXPECT_EQ(plan.ForRows(32), GemmRoute::kAmx);
  EXPECT_EQ(plan.ForRows(2048), GemmRoute::kF32Fma);
}

TEST_F(GemmRouteSwitchTest, ActiveRouteIsNeverAutoAndFollowsSetAndEnvironment) {
  const GemmPlan startup = ActiveGemmPlan();
  for (GemmRoute r : {startup.decode, startup.batch, startup.prefill}) EXPECT_NE(r, GemmRoute::kAuto);
  EXPECT_NE(GemmRouteDescription(DType::kBF16).find(GemmPlanName(startup)), std::string::npos);
  EXPECT_NE(GemmRouteDescription(DType::kBF16).find("start-up choice"), std::string::npos);
  // The fp32 pipeline multiplies with fp32 FMAs whatever the routes.
  EXPECT_EQ(PipelineGemmPlan(DType::kF32), GemmPlan::All(GemmRoute::kF32Fma));
  EXPECT_EQ(PipelineGemmPlan(DType::kBF16), startup);
  EXPECT_EQ(GemmRouteDescription(DType::kF32), "decode=fp32_fma,batch=fp32_fma,prefill=fp32_fma (the fp32 pipeline)");
  SetGemmRoute(GemmRoute::kF32Fma);
  EXPECT_EQ(ActiveGemmPlan(), GemmPlan::All(GemmRoute::kF32Fma));
  EXPECT_EQ(ActiveGemmRoute(4096), GemmRoute::kF32Fma);
  EXPECT_NE(GemmRouteDescription(DType::kBF16).find("decode=fp32_fma,batch=fp32_fma,prefill=fp32_fma (forced"),
            std::string::npos);
  // One class forced, the others the start-up choice.
  SetGemmPlan({GemmRoute::kAuto, GemmRoute::kAuto, GemmRoute::kF32Fma});
  EXPECT_EQ(ActiveGemmPlan(), (GemmPlan{startup.decode, startup.batch, GemmRoute::kF32Fma}));
  EXPECT_NE(GemmRouteDescription(DType::kBF16).find("forced in part"), std::string::npos);
  SetGemmRoute(GemmRoute::kAuto);
  EXPECT_EQ(ActiveGemmPlan(), startup);
  setenv("KDA_GEMM_ROUTE", "batch=fp32_fma", 1);
  internal::ResetGemmRouteForTesting();
  EXPECT_EQ(ActiveGemmPlan(), (GemmPlan{startup.decode, GemmRoute::kF32Fma, startup.prefill}));
  setenv("KDA_GEMM_ROUTE", "fast", 1);
  internal::ResetGemmRouteForTesting();
  ExpectErrorContaining([] { ActiveGemmPlan(); }, "KDA_GEMM_ROUTE environment variable: unknown GEMM route 'fast'");
  // A bad value is an error where the route is needed: a Linear's forward.
  const Linear l(std::vector<float>(32, 1.0F), 1, 32, DType::kBF16);
  std::vector<BF16> x(32, ToBF16(1.0F));
  std::vector<BF16> y(1);
  ExpectErrorContaining([&] { l.Forward({y.data(), DType::kBF16}, {x.data(), DType::kBF16}, 1); }, "KDA_GEMM_ROUTE");
}

// The start-up choice follows what the process runs: the tiles for batches and
// prefill where the OS grants them and oneDNN reaches them; decode steps on
// kda's small-M kernels, with the faster instruction per core.
TEST_F(GemmRouteSwitchTest, StartupChoiceTakesTheTilesWhereTheyRun) {
  const GemmPlan plan = ActiveGemmPlan();
  EXPECT_NE(plan.decode, GemmRoute::kAmx);
  if (!CpuSupportsGemmRoute(GemmRoute::kAmx)) {
    std::printf("[ NOTE     ] this host runs no AMX tiles (%s): the amx route is not tested here\n",
                AmxTilesGranted() ? "granted, but oneDNN has no bf16 matmul on them" : "none granted");
    EXPECT_NE(plan.batch, GemmRoute::kAmx);
    EXPECT_NE(GemmRouteDescription(DType::kBF16).find("AMX tiles"), std::string::npos);
    ExpectErrorContaining([] { SetGemmRoute(GemmRoute::kAmx); }, "GEMM route 'amx' cannot run here");
    return;
  }
  EXPECT_TRUE(AmxTilesGranted());
  EXPECT_EQ(plan.batch, GemmRoute::kAmx);
  EXPECT_EQ(plan.prefill, GemmRoute::kAmx);
  EXPECT_NE(GemmRouteDescription(DType::kBF16).find("AMX tiles granted, oneDNN brg:avx512_core_amx"),
            std::string::npos);
  // The tile loop runs here.
  float sink = 0.0F;
  EXPECT_GT(RunProbeLoop(ProbeInstruction::kAmxBf16, 16, &sink), 0.0);
  EXPECT_GT(ProbeGflopsOneThread(ProbeInstruction::kAmxBf16, 1e-4, 1),
            ProbeGflopsOneThread(ProbeInstruction::kFma, 1e-4, 1));
}

TEST_F(GemmRouteSwitchTest, KernelIsaLimitsTheRoutes) {
  // The bf16 dot and the tiles need the avx512 kernels: under any other ISA
  // they do not exist, forcing them is an error and the start-up choice falls
  // back to fp32 FMA.
  for (KernelIsa isa : testing::SupportedIsas()) {
    if (isa == KernelIsa::kAvx512) continue;
    SetKernelIsa(isa);
    for (GemmRoute r : {GemmRoute::kBf16Dot, GemmRoute::kAmx}) {
      EXPECT_FALSE(CpuSupportsGemmRoute(r)) << KernelIsaName(isa);
      ExpectErrorContaining([r] { SetGemmRoute(r); },
                            std::string("GEMM route '") + GemmRouteName(r) + "' cannot run here");
    }
    EXPECT_EQ(ActiveGemmPlan(), GemmPlan::All(GemmRoute::kF32Fma)) << KernelIsaName(isa);
  }
  internal::ResetKernelIsaForTesting();
  EXPECT_TRUE(CpuSupportsGemmRoute(GemmRoute::kF32Fma));
  EXPECT_TRUE(CpuSupportsGemmRoute(GemmRoute::kAuto));
}

}  // namespace
}  // namespace kda
