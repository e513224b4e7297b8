// The Q8 weight format (kda/kernels/q8.h): fp16 conversions, the quantizer on
// hand-made blocks (ties, zero blocks, clamp, fp16 rounding of the scale,
// subnormal scales), its checks of bad input, shards; and the Q8 Linear over
// the kernel matrix (small-M kernel and dequantized-panel GEMM in every ISA;
// it has no reference variant: Q8LinearReference is the plain reference)
// against the plain reference and against a dense Linear holding the
// dequantized weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/base/tolerance.h"
#include "kda/kernels/linear.h"
#include "kda/kernels/q8.h"
#include "tests/error_util.h"
#include "tests/kernel_matrix.h"
#include "tests/thread_scope.h"

namespace kda {
namespace {

using testing::ExpectErrorContaining;

TEST(Q8Half, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0F), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0F), 0xc000);
  EXPECT_EQ(FloatToHalfBits(0.0F), 0x0000);
  EXPECT_EQ(FloatToHalfBits(-0.0F), 0x8000);
  EXPECT_EQ(FloatToHalfBits(65504.0F), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65519.0F), 0x7bff);                    // below the tie: largest finite
  EXPECT_EQ(FloatToHalfBits(65520.0F), 0x7c00);                    // the tie rounds to even: infinity
  EXPECT_EQ(FloatToHalfBits(1.0F + 0x1p-11F), 0x3c00);             // tie between 1 and 1 + 2^-10: even (1)
  EXPECT_EQ(FloatToHalfBits(1.0F + 3 * 0x1p-11F), 0x3c02);         // tie between +1 and +2 ulp: even (+2)
  EXPECT_EQ(FloatToHalfBits(1.0F + 0x1p-11F + 0x1p-20F), 0x3c01);  // above the tie
  EXPECT_EQ(FloatToHalfBits(0x1p-24F), 0x0001);                    // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(0x1p-25F), 0x0000);                    // tie to even: 0
  EXPECT_EQ(FloatToHalfBits(3 * 0x1p-25F), 0x0002);                // 1.5 ulp: tie to even 2
  EXPECT_EQ(FloatToHalfBits(0x1p-14F - 0x1p-26F), 0x0400);         // rounds up into the smallest normal
  EXPECT_EQ(FloatToHalfBits(1.0F / 127.0F), 0x2008);               // 2^-7 (1 + 8/1024): 8.06 rounds down
  EXPECT_EQ(FloatToHalfBits(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(NAN) & 0x7c00, 0x7c00);
  EXPECT_NE(FloatToHalfBits(NAN) & 0x03ff, 0);
}

TEST(Q8Half, EveryFiniteHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00U) == 0x7c00U) continue;  // inf / NaN
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToHalfBits(f), h) << "half bits " << h << " value " << f;
  }
  EXPECT_EQ(HalfBitsToFloat(0x0001), 0x1p-24F);
  EXPECT_EQ(HalfBitsToFloat(0x3c01), 1.0F + 0x1p-10F);
  EXPECT_TRUE(std::isinf(HalfBitsToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7e00)));
}

// One row of 32 values, the rest zero.
std::vector<float> Block(std::initializer_list<float> head) {
  std::vector<float> w(32, 0.0F);
  size_t i = 0;
  for (float v : head) w[i++] = v;
  return w;
}

TEST(Q8Quantize, TiesRoundHalfAwayFromZero) {
  // max |w| = 127: d = 1 exactly, q = round(w).
  const Q8Weight q = QuantizeQ8(Block({127.0F, -63.5F, 0.5F, 1.5F, -0.5F, 2.5F, -2.5F, 0.49F, -126.6F}), 1, 32);
  EXPECT_EQ(q.scales[0], 0x3c00);
  const std::vector<int> want = {127, -64, 1, 2, -1, 3, -3, 0, -127};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(q.q[i], want[i]) << i;
  for (size_t i = want.size(); i < 32; ++i) EXPECT_EQ(q.q[i], 0) << i;
}

TEST(Q8Quantize, ScaleIsFp16RoundedAndQUsesIt) {
  // max |w| = 1: d = 1/127 rounds to 2^-7 (1 + 8/1024) = 0.00787353515625.
  const Q8Weight q = QuantizeQ8(Block({1.0F, -1.0F, 0.5F, 0.003936767578125F}), 1, 32);
  EXPECT_EQ(q.scales[0], 0x2008);
  const float d = 0.00787353515625F;
  EXPECT_EQ(HalfBitsToFloat(q.scales[0]), d);
  EXPECT_EQ(q.q[0], 127);  // 1 / d = 127.007
  EXPECT_EQ(q.q[1], -127);
  EXPECT_EQ(q.q[2], 64);  // 0.5 / d = 63.504
  EXPECT_EQ(q.q[3], 1);   // d / 2 / d = 0.5 exactly: a tie, away from zero
  const std::vector<float> deq = DequantizeQ8(q);
  EXPECT_EQ(deq[0], d * 127.0F);
  EXPECT_EQ(deq[2], d * 64.0F);
}

TEST(Q8Quantize, ZeroBlockHasZeroScaleAndValues) {
  const std::vector<float> w(64, 0.0F);
  const Q8Weight q = QuantizeQ8(w, 1, 64);
  EXPECT_EQ(q.scales, std::vector<uint16_t>({0, 0}));
  for (int8_t v : q.q) EXPECT_EQ(v, 0);
  for (float v : DequantizeQ8(q)) EXPECT_EQ(v, 0.0F);
}

TEST(Q8Quantize, SubnormalScaleClampsAndTinyScaleIsZero) {
  // d = 1.4 * 2^-24 rounds to the subnormal 2^-24: max|w| / fp16(d) = 177.8, clamped to 127.
  const float amax = 127.0F * 1.4F * 0x1p-24F;
  const Q8Weight q = QuantizeQ8(Block({amax, -amax, 0.5F * amax}), 1, 32);
  EXPECT_EQ(q.scales[0], 0x0001);
  EXPECT_EQ(q.q[0], 127);
  EXPECT_EQ(q.q[1], -127);
  EXPECT_EQ(q.q[2], 89);  // 88.9
  // d = 0.4 * 2^-24 rounds to 0: the block is all zero.
  const float tiny = 127.0F * 0.4F * 0x1p-24F;
  const Q8Weight z = QuantizeQ8(Block({tiny, -tiny}), 1, 32);
  EXPECT_EQ(z.scales[0], 0);
  EXPECT_EQ(z.q[0], 0);
  EXPECT_EQ(z.q[1], 0);
}

TEST(Q8Quantize, BlocksAreRowsOf32AndErrorIsHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0F, 0.02F);
  const int64_t rows = 5;
  const int64_t cols = 96;
  std::vector<float> w(rows * cols);
  for (float& v : w) v = RoundBF16(nd(rng));
  w[1 * cols + 40] = 3.0F;  // one large value: only its block's scale grows
  const Q8Weight q = QuantizeQ8(w, rows, cols);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(rows * 3));
  EXPECT_EQ(q.scales[1 * 3 + 1], FloatToHalfBits(3.0F / 127.0F));
  const std::vector<float> deq = DequantizeQ8(q);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float d = HalfBitsToFloat(q.scales[i / 32]);
    EXPECT_EQ(deq[i], d * static_cast<float>(q.q[i]));
    EXPECT_LE(std::fabs(deq[i] - w[i]), 0.5F * d * (1.0F + 1e-6F)) << i;
  }
  // A shard of rows and 32-aligned columns equals quantizing that block.
  std::vector<float> cut;
  for (int64_t r = 1; r < 4; ++r) cut.insert(cut.end(), w.begin() + r * cols + 32, w.begin() + r * cols + 96);
  const Q8Weight s = SliceQ8(q, 1, 4, 32, 96);
  const Q8Weight s2 = QuantizeQ8(cut, 3, 64);
  EXPECT_EQ(s.q, s2.q);
  EXPECT_EQ(s.scales, s2.scales);
}

TEST(Q8Quantize, BadInputIsAClearError) {
  ExpectErrorContaining([] { QuantizeQ8(std::vector<float>(40, 1.0F), 1, 40, "f_b_proj"); },
                        "f_b_proj has input dim 40, which is not a multiple of the block size 32");
  std::vector<float> w(64, 0.5F);
  w[37] = NAN;
  ExpectErrorContaining([&] { QuantizeQ8(w, 2, 32, "q_proj"); }, "q_proj element [1, 5] is not finite");
  w[37] = 1e7F;  // d = 78740 > 65504
  ExpectErrorContaining([&] { QuantizeQ8(w, 2, 32, "q_proj"); }, "overflows fp16");
  Q8Weight good = QuantizeQ8(std::vector<float>(64, 0.5F), 1, 64);
  for (uint16_t bad : {uint16_t{0x7e00}, uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0xbc00}}) {
    Q8Weight b = good;
    b.scales[1] = bad;
    ExpectErrorContaining([&] { CheckQ8Weight(b, "o_proj"); }, "o_proj scale [0, 1] is");
    ExpectErrorContaining([&] { Linear l(b, DType::kF32); }, "scales must be finite and >= 0");
  }
  Q8Weight b = good;
  b.q[3] = -128;
  ExpectErrorContaining([&] { CheckQ8Weight(b, "o_proj"); }, "o_proj element [0, 3] is -128");
  b = good;
  b.scales.pop_back();
  ExpectErrorContaining([&] { CheckQ8Weight(b, "o_proj"); }, "do not match its shape");
  ExpectErrorContaining([] { ParseWeightFormat("int4"); }, "unknown weight format 'int4'");
  EXPECT_EQ(ParseWeightFormat("int8"), WeightFormat::kInt8);
  EXPECT_EQ(ParseWeightFormat("bf16"), WeightFormat::kDense);
}

// ---------------------------------------------------------------- Q8 Linear

using testing::VariantTest;

class Q8LinearTest : public VariantTest {};

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
  LinearProblem p{n, k, QuantizeQ8(w, n, k), {}};
  p.dense = DequantizeQ8(p.w);
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

TEST_P(Q8LinearTest, MatchesReferenceAndDenseLinearOnDequantizedWeights) {
  // Row counts around the small-M kernel's tiles (1, 2, 4, 8) and its limit
  // (16); output dims with tails of the 4- and 2-row blocks and of a job; an
  // input dim of 25 blocks: spans of 8 blocks and a tail (16-register targets
  // walk batches of 8+ rows in spans, over groups of 8 output rows: n = 19).
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {130, 256}, {3, 32}, {19, 800}}) {
    const LinearProblem p = MakeProblem(n, k, static_cast<uint32_t>(n * 1000 + k));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const bool bf16 = dtype == DType::kBF16;
      const Linear q8(p.w, dtype);
      const Linear dense(p.dense, n, k, dtype);
      EXPECT_EQ(q8.weight_format(), WeightFormat::kInt8);
      EXPECT_EQ(q8.weight_bytes(), n * k + 2 * n * (k / 32));
      for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 40}) {
        const std::vector<float> x = Inputs(m, k, static_cast<uint32_t>(m));
        std::vector<float> ref(m * n);
        Q8LinearReference(ref.data(), x.data(), p.w, m, bf16);
        const std::string what = std::string(DTypeName(dtype)) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                                 " m " + std::to_string(m);
        const std::vector<float> y = RunLinear(q8, x, m, dtype);
        ExpectCloseToReference(y, ref, p, x, m, bf16, what + " vs reference");
        ExpectCloseToReference(RunLinear(dense, x, m, dtype), ref, p, x, m, bf16, what + " dense vs reference");
        if (m > 16) {  // the same GEMM on the same bf16/fp32 weights (one tile at these sizes): identical
          EXPECT_EQ(y, RunLinear(dense, x, m, dtype)) << what;
        }
      }
    }
  }
}

TEST_P(Q8LinearTest, LargeMRunsTheWeightInTilesOfOutputRows) {
  // Above the small-M limit the weight is dequantized a tile of output rows
  // at a time (a panel of ~1 MiB per thread): with one thread at k = 8192,
  // 32 rows per tile in fp32, 64 in bf16, so 300 rows end in a partial tile
  // either way.
  const testing::ThreadScope one_thread(1);
  constexpr int64_t kN = 300;
  constexpr int64_t kK = 8192;
  const LinearProblem p = MakeProblem(kN, kK, 11);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const bool bf16 = dtype == DType::kBF16;
    const Linear q8(p.w, dtype);
    for (int64_t m : {17, 33}) {
      const std::vector<float> x = Inputs(m, kK, static_cast<uint32_t>(m));
      std::vector<float> ref(m * kN);
      Q8LinearReference(ref.data(), x.data(), p.w, m, bf16);
      const std::string what = std::string(DTypeName(dtype)) + " m " + std::to_string(m);
      const std::vector<float> y = RunLinear(q8, x, m, dtype);
      // Not bitwise the dense GEMM's result: the GEMM library may order the
      // sums over k differently for a tile's column count.
      ExpectCloseToReference(y, ref, p, x, m, bf16, what);
    }
  }
}

TEST_P(Q8LinearTest, Bf16PipelineRoundsTheDequantizedWeightToBf16) {
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

INSTANTIATE_TEST_SUITE_P(Kda, Q8LinearTest, ::testing::ValuesIn(testing::OptimizedVariants()),
                         testing::VariantParamName());

}  // namespace
}  // namespace kda
