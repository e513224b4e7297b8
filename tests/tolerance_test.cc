// The bf16 rule of design §5 itself: it passes a correct bf16 pipeline that
// differs from the reference in rounding flips, and fails a pipeline without
// the cast points, a 0.2% scale error and 0.3% noise.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/tolerance.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

// A small network with the structure of the layer's bf16 pipeline and its
// output magnitude (rms ~0.7): bf16 input, a projection, SiLU, a second
// projection, an RMS norm and a wide output projection, each result cast to
// bf16 (the cast points). The projections sum in double and round to fp32
// (a GEMM's blocked sums are about that exact) or sum in fp32 in sequence (a
// correct but different pipeline: it flips some bf16 roundings, which
// cascade). Without `cast` every intermediate stays unrounded. Exact: float64
// throughout. The result is before the output's bf16 rounding.
struct Net {
  static constexpr int kT = 32;
  static constexpr int kD = 512;     // input and output width
  static constexpr int kM = 1024;    // inner width
  std::vector<float> x, w1, w2, w3;  // [T, D], [D, M], [M, M], [M, D]

  Net() {
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0F, 1.0F);
    const auto fill = [&](std::vector<float>& v, size_t size, float scale) {
      v.resize(size);
      for (float& e : v) e = RoundBF16(scale * n(rng));
    };
    fill(x, size_t{kT} * kD, 1.0F);
    fill(w1, size_t{kD} * kM, 1.0F / std::sqrt(float{kD}));
    fill(w2, size_t{kM} * kM, 1.0F / std::sqrt(float{kM}));
    fill(w3, size_t{kM} * kD, 0.7F / std::sqrt(float{kM}));
  }

  enum class Sum { kExact, kRounded, kSequentialF32 };

  static std::vector<double> MatMul(const std::vector<double>& a, const std::vector<float>& w, int in, int out,
                                    Sum sum) {
    std::vector<double> y(static_cast<size_t>(kT) * out);
    for (int t = 0; t < kT; ++t) {
      const double* at = &a[static_cast<size_t>(t) * in];
      for (int j = 0; j < out; ++j) {
        double d = 0;
        float f = 0;
        for (int i = 0; i < in; ++i) {
          const double p = at[i] * w[static_cast<size_t>(i) * out + j];
          d += p;
          f += static_cast<float>(p);  // bf16 x bf16 is exact in fp32
        }
        y[static_cast<size_t>(t) * out + j] =
            sum == Sum::kExact ? d : (sum == Sum::kRounded ? static_cast<float>(d) : f);
      }
    }
    return y;
  }

  std::vector<double> Run(bool cast, Sum sum) const {
    const auto c = [&](std::vector<double> v) {
      if (cast) {
        for (double& e : v) e = RoundBF16(static_cast<float>(e));
      }
      return v;
    };
    std::vector<double> h(x.begin(), x.end());
    h = c(MatMul(h, w1, kD, kM, sum));
    for (double& e : h) e = e / (1.0 + std::exp(-e));
    h = c(h);
    h = c(MatMul(h, w2, kM, kM, sum));
    for (int t = 0; t < kT; ++t) {
      double* ht = &h[static_cast<size_t>(t) * kM];
      double ss = 0;
      for (int i = 0; i < kM; ++i) ss += ht[i] * ht[i];
      const double rstd = 1.0 / std::sqrt(ss / kM + 1e-5);
      for (int i = 0; i < kM; ++i) ht[i] *= rstd;
    }
    h = c(h);
    return MatMul(h, w3, kM, kD, sum);
  }

  static std::vector<float> Round(const std::vector<double>& v) {
    std::vector<float> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = RoundBF16(static_cast<float>(v[i]));
    return r;
  }
};

// The network's runs, made once for the suite.
class BF16RuleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const Net net;
    const std::vector<double> e = net.Run(/*cast=*/false, Net::Sum::kExact);
    exact_ = new std::vector<float>(e.begin(), e.end());
    ref_ = new std::vector<float>(Net::Round(net.Run(/*cast=*/true, Net::Sum::kRounded)));
    other_pre_ = new std::vector<double>(net.Run(/*cast=*/true, Net::Sum::kSequentialF32));
    no_cast_pre_ = new std::vector<double>(net.Run(/*cast=*/false, Net::Sum::kRounded));
  }
  static void TearDownTestSuite() {
    delete exact_;
    delete ref_;
    delete other_pre_;
    delete no_cast_pre_;
  }
  static ToleranceReport Check(const std::vector<float>& a) {
    return CompareBF16(a.data(), ref_->data(), exact_->data(), a.size());
  }

  static std::vector<float>* exact_;         // x
  static std::vector<float>* ref_;           // r: the reference bf16 pipeline
  static std::vector<double>* other_pre_;    // a correct bf16 pipeline (other sums), before its output rounding
  static std::vector<double>* no_cast_pre_;  // the pipeline without the cast points, before its output rounding
};

std::vector<float>* BF16RuleTest::exact_ = nullptr;
std::vector<float>* BF16RuleTest::ref_ = nullptr;
std::vector<double>* BF16RuleTest::other_pre_ = nullptr;
std::vector<double>* BF16RuleTest::no_cast_pre_ = nullptr;

TEST_F(BF16RuleTest, PassesACorrectPipelineThatDiffersInRoundingFlips) {
  const std::vector<float> a = Net::Round(*other_pre_);
  const ToleranceReport rep = Check(a);
  EXPECT_TRUE(rep.ok) << rep.Summary();
  EXPECT_NE(a, *ref_);             // the sum order flips bf16 roundings...
  EXPECT_GT(rep.rel_l2, 1e-4);     // ...visibly
  EXPECT_GT(rep.rel_l2_rx, 1e-3);  // and both are far from exact at the same distance
  EXPECT_LT(rep.rel_l2_ax, 1.1 * rep.rel_l2_rx);
  EXPECT_TRUE(testing::AllCloseBF16(a.data(), ref_->data(), exact_->data(), a.size()));
  // The reference against itself: every ratio at 1/1.1 or less.
  EXPECT_TRUE(Check(*ref_).ok);
}

TEST_F(BF16RuleTest, FailsAPipelineWithoutCastPoints) {
  const std::vector<float> a = Net::Round(*no_cast_pre_);
  const ToleranceReport rep = Check(a);
  EXPECT_FALSE(rep.ok) << rep.Summary();
  EXPECT_GT(rep.rel_l2, 2e-3) << rep.Summary();              // part 1: not the reference's cast points
  EXPECT_LT(rep.rel_l2_ax, rep.rel_l2_rx) << rep.Summary();  // although closer to exact
  EXPECT_FALSE(testing::AllCloseBF16(a.data(), ref_->data(), exact_->data(), a.size()));
}

TEST_F(BF16RuleTest, FailsAScaleErrorOfTwoPerMille) {
  std::vector<double> pre = *other_pre_;
  for (double& e : pre) e *= 1.002;
  const ToleranceReport rep = Check(Net::Round(pre));
  EXPECT_FALSE(rep.ok) << rep.Summary();
  EXPECT_GT(rep.max_ratio, 1.0);
}

TEST_F(BF16RuleTest, FailsNoiseOfThreePerMille) {
  std::mt19937 rng(9);
  std::normal_distribution<double> n(0.0, 3e-3);
  std::vector<double> pre = *other_pre_;
  for (double& e : pre) e *= 1.0 + n(rng);
  const ToleranceReport rep = Check(Net::Round(pre));
  EXPECT_FALSE(rep.ok) << rep.Summary();
}

// Part 2 alone: within the cast-point bounds of r, but less accurate: 20%
// more error everywhere, or one element twice as far off as r's worst.
TEST_F(BF16RuleTest, FailsAPipelineLessAccurateThanTheReference) {
  std::vector<float> a(ref_->size());
  const std::vector<float>& x = *exact_;
  const std::vector<float>& r = *ref_;
  for (size_t i = 0; i < a.size(); ++i) a[i] = x[i] + 1.2F * (r[i] - x[i]);
  ToleranceReport rep = Check(a);
  EXPECT_FALSE(rep.ok) << rep.Summary();
  EXPECT_LE(rep.rel_l2, 2e-3) << rep.Summary();
  EXPECT_LE(rep.outside, a.size() / 200) << rep.Summary();
  EXPECT_GT(rep.rel_l2_ax, 1.1 * rep.rel_l2_rx) << rep.Summary();

  a = r;
  const size_t i = Check(a).worst_ax;
  a[i] = RoundBF16(x[i] + 2.0F * (r[i] - x[i]));
  rep = Check(a);
  EXPECT_FALSE(rep.ok) << rep.Summary();
  EXPECT_LE(rep.rel_l2, 2e-3) << rep.Summary();
  EXPECT_LE(rep.outside, 1U) << rep.Summary();
  EXPECT_GT(rep.max_ax, 1.5 * rep.max_rx) << rep.Summary();
  EXPECT_EQ(rep.worst_ax, i);
}

TEST(CompareBF16, ReportsEveryQuantityAndFailsNaN) {
  const std::vector<float> x = {1.0F, -2.0F, 0.5F, 0.0F};
  const std::vector<float> r = {1.0F, -2.0F, 0.5F, 0.0F};
  std::vector<float> a = r;
  EXPECT_TRUE(CompareBF16(a.data(), r.data(), x.data(), a.size()).ok);
  a[2] = std::numeric_limits<float>::quiet_NaN();
  const ToleranceReport rep = CompareBF16(a.data(), r.data(), x.data(), a.size());
  EXPECT_FALSE(rep.ok);
  EXPECT_EQ(rep.outside, 1U);
  EXPECT_EQ(rep.first_bad, 2U);
  const std::string s = rep.Summary();
  for (const char* part : {"vs ref relL2", "outside tol(r)", "vs exact relL2", "max err/tol(x)", "first at 2"}) {
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
  }
  // r == x exactly: a must be exact too.
  a = r;
  a[0] = RoundBF16(1.0F + 1.0F / 128);
  EXPECT_FALSE(CompareBF16(a.data(), r.data(), x.data(), a.size()).ok);
  EXPECT_TRUE(CompareBF16(a.data(), r.data(), x.data(), 0).ok);
}

TEST(CompareStateF32, AbsoluteTermScalesWithTheLargestEntry) {
  const std::vector<float> r = {100.0F, 0.0F};
  std::vector<float> a = {100.0F, 9e-4F};  // within 1e-5 * 100
  EXPECT_TRUE(CompareStateF32(a.data(), r.data(), a.size()).ok);
  EXPECT_FALSE(CompareF32(a.data(), r.data(), a.size()).ok);
  a[1] = 1.1e-3F;
  EXPECT_FALSE(CompareStateF32(a.data(), r.data(), a.size()).ok);
  const std::vector<float> small = {0.5F, 0.0F};
  const std::vector<float> b = {0.5F, 1.1e-5F};  // max(1, max|r|) = 1
  EXPECT_FALSE(CompareStateF32(b.data(), small.data(), b.size()).ok);
}

}  // namespace
}  // namespace kda
