// The element-wise kernels (short conv + SiLU, forget gate and beta, gated
// RMSNorms, residual add, bf16 conversions) over the kernel matrix
// (tests/kernel_matrix.h): the reference and every ISA variant of the
// optimized version against a float64 (or exact) oracle written here, the
// optimized ones also against the reference; and each ISA's vector math
// against libm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/bf16.h"
#include "kda/base/error.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/kda_gate.h"
#include "kda/kernels/short_conv.h"
#include "kernels/isa/dispatch.h"
#include "tests/error_util.h"
#include "tests/kernel_matrix.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;
using testing::AllVariants;
using testing::ExpectErrorContaining;
using testing::OptimizedVariants;
using testing::VariantParamName;
using testing::VariantTest;

std::vector<float> Random(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

ActBuffer ToAct(DType dt, const std::vector<float>& v) {
  ActBuffer b(dt, static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) b.Set(static_cast<int64_t>(i), v[i]);
  return b;
}

double SoftplusF64(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
double SigmoidF64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// got vs a float64 oracle: the fp32 rule for F32 outputs; for BF16 ones the
// bf16 rule, with the oracle rounded once to bf16 as the reference pipeline
// and the oracle itself as the exact output.
::testing::AssertionResult CloseToOracle(DType dt, const std::vector<float>& got, const std::vector<double>& want) {
  const std::vector<float> w(want.begin(), want.end());
  if (dt == DType::kF32) return AllCloseF32(got.data(), w.data(), w.size());
  std::vector<float> rounded(w.size());
  for (size_t i = 0; i < w.size(); ++i) rounded[i] = RoundBF16(w[i]);
  return AllCloseBF16(got.data(), rounded.data(), w.data(), w.size());
}

// An optimized kernel's output against the reference kernel's on the same
// inputs: fp32 within 1e-6 (SiLU's exp differs from libm's by an ulp or two,
// which can flip a bf16 rounding), bf16 by rule v2 against the exact oracle.
::testing::AssertionResult CloseToReference(DType dt, const std::vector<float>& got, const std::vector<float>& ref,
                                            const std::vector<double>& exact) {
  if (dt == DType::kF32) return AllCloseF32(got.data(), ref.data(), ref.size(), 1e-6, 1e-6);
  const std::vector<float> x(exact.begin(), exact.end());
  return AllCloseBF16(got.data(), ref.data(), x.data(), ref.size());
}

// y against the float64 oracle and, for an optimized variant, against the reference kernel's output
// (written by ref_run into a buffer like y's).
template <class RefRun>
void ExpectNearOracleAndReference(DType dt, const ActBuffer& y, const std::vector<double>& want, bool optimized,
                                  RefRun ref_run) {
  const std::vector<float> got = y.ToFloat();
  EXPECT_TRUE(CloseToOracle(dt, got, want));
  if (!optimized) return;
  ActBuffer y_ref(dt, static_cast<int64_t>(got.size()));
  ref_run(y_ref.mut());
  EXPECT_TRUE(CloseToReference(dt, got, y_ref.ToFloat(), want));
}

// A gated norm's check on random inputs in dt: o [n] in (-2, 2), the gate [n] in (-8, 8), the weights
// [w_size] in (0.5, 1.5) (seeds seed, seed + 1, seed + 2); run(y, o, gate, w) against oracle(o, gate, w) and,
// optimized, against reference(y, o, gate, w).
template <class Run, class Reference, class Oracle>
void CheckGatedNormOnRandomInputs(DType dt, size_t n, size_t w_size, uint32_t seed, bool optimized, Run run,
                                  Reference reference, Oracle oracle) {
  const ActBuffer o = ToAct(dt, Random(n, -2, 2, seed));
  const ActBuffer gate = ToAct(dt, Random(n, -8, 8, seed + 1));
  const std::vector<float> w = Random(w_size, 0.5F, 1.5F, seed + 2);
  ActBuffer y(dt, static_cast<int64_t>(n));
  run(y.mut(), o.view(), gate.view(), w.data());
  ExpectNearOracleAndReference(dt, y, oracle(o, gate, w), optimized,
                               [&](MutBuf y_ref) { reference(y_ref, o.view(), gate.view(), w.data()); });
}

// ------------------------------------------------------------ short conv

class ShortConvTest : public VariantTest {
 protected:
  // Runs the case's kernel (short_conv_silu, or short_conv_silu_reference) on
  // the sequences `cu` of x (N and T from cu) into y, and on the tails in
  // place (sequence n's at tails[idx[n]]); x and the tails with rows `stride`
  // apart, w [W, C], bias [C] or null. Returns the arguments, for a rerun.
  ShortConvArgs RunShortConv(MutBuf y, ConstBuf x, MutBuf tails, int64_t stride, const std::vector<float>& w,
                             const std::vector<int64_t>& cu, int64_t C, int W, int64_t num_tails,
                             const std::vector<int32_t>& idx, const std::vector<uint8_t>& has_init,
                             const float* bias = nullptr) const {
    ShortConvArgs a;
    a.y = y;
    a.x = x;
    a.x_row_stride = stride;
    a.weight = w.data();
    a.bias = bias;
    a.cu_seqlens = cu.data();
    a.N = static_cast<int64_t>(cu.size()) - 1;
    a.T = cu.back();
    a.C = C;
    a.W = W;
    a.tails = tails;
    a.tail_row_stride = stride;
    a.num_tails = num_tails;
    a.tail_indices = idx.data();
    a.has_initial_state = has_init.data();
    if (variant().optimized()) {
      short_conv_silu(a);
    } else {
      short_conv_silu_reference(a);
    }
    return a;
  }
};

// The float64 oracle of a RunShortConv call (x and tails0 rows `stride`
// apart, bias [C] or null): y [T, C] and the tails after the call. Input row i
// of sequence n is its tail, or zeros, before its start; padding sequences
// have zero outputs and leave their tail as it was.
struct ShortConvWant {
  std::vector<double> y;
  std::vector<float> tails;
};
ShortConvWant ShortConvOracle(const ActBuffer& xb, const ActBuffer& tails0, int64_t stride, const std::vector<float>& w,
                              const float* bias, const std::vector<int64_t>& cu, int64_t C, int W,
                              const std::vector<int32_t>& idx, const std::vector<uint8_t>& has_init) {
  ShortConvWant want{std::vector<double>(static_cast<size_t>(cu.back() * C), 0.0), tails0.ToFloat()};
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    if (idx[n] < 0) continue;
    const int64_t len = cu[n + 1] - cu[n];
    auto input = [&](int64_t i, int64_t c) -> double {
      if (i >= 0) return xb.Get((cu[n] + i) * stride + c);
      if (has_init[n] == 0) return 0.0;
      return tails0.Get((idx[n] * (W - 1) + (W - 1 + i)) * stride + c);
    };
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = bias != nullptr ? bias[c] : 0.0;
        for (int j = 0; j < W; ++j) acc += w[j * C + c] * input(t - (W - 1) + j, c);
        want.y[(cu[n] + t) * C + c] = acc * SigmoidF64(acc);
      }
    }
    for (int r = 0; r < W - 1; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        want.tails[(idx[n] * (W - 1) + r) * stride + c] = static_cast<float>(input(len - (W - 1) + r, c));
      }
    }
  }
  return want;
}

// The reference on the call `a` of an optimized run (its output and tails replaced; tails0 the tails before):
// the same fp32 sums, so outputs close to the oracle's `want_y` alike and the same tails.
void ExpectReferenceAgrees(ShortConvArgs a, const ActBuffer& tails0, const std::vector<float>& got_y,
                           const std::vector<float>& got_tails, const std::vector<double>& want_y) {
  const DType dt = a.y.dtype;
  ActBuffer t_ref = ToAct(dt, tails0.ToFloat());
  ActBuffer y_ref(dt, a.T * a.C);
  a.y = y_ref.mut();
  a.tails = t_ref.mut();
  short_conv_silu_reference(a);
  EXPECT_TRUE(CloseToReference(dt, got_y, y_ref.ToFloat(), want_y));
  EXPECT_EQ(got_tails, t_ref.ToFloat());
}

TEST_P(ShortConvTest, MatchesOracleOnRaggedBatchesWithTails) {
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int W : {1, 2, 3, 4, 5}) {
      for (int64_t C : {16, 64, 200, 1100}) {  // 1100: two whole channel chunks and a partial one
        SCOPED_TRACE(std::string(DTypeName(dt)) + " W " + std::to_string(W) + " C " + std::to_string(C));
        // Sequences of 0, 1, 2, 67 and 2 tokens (shorter than the conv: the old tail shifts).
        const std::vector<int64_t> cu = {0, 0, 1, 3, 70, 72};
        const int64_t T = cu.back();
        const int64_t stride = C + 8;  // x and tails with a row stride, as in the backend
        const int rows = std::max(W - 1, 1);
        const ActBuffer xb = ToAct(dt, Random(static_cast<size_t>(T * stride), -3, 3, rng()));
        const std::vector<float> w = Random(static_cast<size_t>(C * W), -1, 1, rng());  // [W, C]
        const ActBuffer tails0 = ToAct(dt, Random(static_cast<size_t>(7 * rows * stride), -2, 2, rng()));
        const std::vector<int32_t> idx = {6, 2, -1, 5, 3};  // sequence 2 (tokens 1, 2) is padding
        const std::vector<uint8_t> has_init = {1, 0, 1, 1, 0};
        ActBuffer tails = ToAct(dt, tails0.ToFloat());
        ActBuffer y(dt, T * C);
        ShortConvArgs a = RunShortConv(y.mut(), xb.view(), tails.mut(), stride, w, cu, C, W, 7, idx, has_init);

        const auto [want_y, want_tails] = ShortConvOracle(xb, tails0, stride, w, nullptr, cu, C, W, idx, has_init);
        const std::vector<float> got_y = y.ToFloat();
        EXPECT_TRUE(CloseToOracle(dt, got_y, want_y));
        for (int64_t i = cu[2] * C; i < cu[3] * C; ++i) ASSERT_EQ(got_y[i], 0.0F);  // padding rows
        EXPECT_EQ(tails.ToFloat(), want_tails);  // slots 0, 1, 4 (no sequence) unchanged

        if (variant().optimized()) ExpectReferenceAgrees(a, tails0, y.ToFloat(), tails.ToFloat(), want_y);
      }
    }
  }
}

TEST_P(ShortConvTest, AddsTheBiasBeforeTheSilu) {
  // Mamba2's conv1d: y = silu(taps + bias[c]). Channel counts off the vector
  // widths (531: a whole channel chunk and 19 channels), sequences with tails,
  // fresh, shorter than the conv, and padding.
  std::mt19937 rng(2);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int W : {2, 3, 4}) {
      for (int64_t C : {5, 13, 37, 531}) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + " W " + std::to_string(W) + " C " + std::to_string(C));
        // Sequences of 3, 0, 38, 1 and 8 tokens; the last is padding.
        const std::vector<int64_t> cu = {0, 3, 3, 41, 42, 50};
        const std::vector<int32_t> idx = {4, 0, 2, 1, -1};
        const std::vector<uint8_t> has_init = {1, 1, 0, 1, 1};
        const int64_t T = cu.back();
        const int64_t stride = C + 3;
        const ActBuffer xb = ToAct(dt, Random(static_cast<size_t>(T * stride), -3, 3, rng()));
        const std::vector<float> w = Random(static_cast<size_t>(C * W), -1, 1, rng());  // [W, C]
        std::vector<float> bias = Random(static_cast<size_t>(C), -4, 4, rng());         // [C]
        bias[0] = -40.0F;  // channel 0: every sum far below zero, so silu(sum + bias) ~ 0, not ~ bias
        const ActBuffer tails0 = ToAct(dt, Random(static_cast<size_t>(5 * (W - 1) * stride), -2, 2, rng()));
        ActBuffer tails = ToAct(dt, tails0.ToFloat());
        ActBuffer y(dt, T * C);
        ShortConvArgs a =
            RunShortConv(y.mut(), xb.view(), tails.mut(), stride, w, cu, C, W, 5, idx, has_init, bias.data());

        const auto [want_y, want_tails] = ShortConvOracle(xb, tails0, stride, w, bias.data(), cu, C, W, idx, has_init);
        const std::vector<float> got_y = y.ToFloat();
        EXPECT_TRUE(CloseToOracle(dt, got_y, want_y));
        for (int64_t t = 0; t < cu[4]; ++t) {  // inside the SiLU: silu(x) for x in [-52, -28] is in (-1e-10, 0)
          ASSERT_LT(got_y[t * C], 0.0F);
          ASSERT_GT(got_y[t * C], -1e-10F);
        }
        for (int64_t i = cu[4] * C; i < T * C; ++i) ASSERT_EQ(got_y[i], 0.0F);  // padding rows: no bias
        EXPECT_EQ(tails.ToFloat(), want_tails);                                 // the tails hold inputs: no bias

        if (variant().optimized()) ExpectReferenceAgrees(a, tails0, got_y, tails.ToFloat(), want_y);

        // No bias and a zero bias: the same bits (the sums are never -0 here).
        const std::vector<float> zeros(static_cast<size_t>(C), 0.0F);
        auto run = [&](const float* b) {
          ActBuffer out(dt, T * C);
          ActBuffer t = ToAct(dt, tails0.ToFloat());
          RunShortConv(out.mut(), xb.view(), t.mut(), stride, w, cu, C, W, 5, idx, has_init, b);
          return out;
        };
        const ActBuffer y_none = run(nullptr);
        const ActBuffer y_zero = run(zeros.data());
        EXPECT_EQ(std::memcmp(y_none.data(), y_zero.data(), static_cast<size_t>(T * C) * DTypeSize(dt)), 0);
        EXPECT_NE(y_none.ToFloat(), got_y);
      }
    }
  }
}

TEST_P(ShortConvTest, CheckpointWeightIsLaidOutTapMajor) {
  // A checkpoint conv1d weight [C, 1, W] laid out once as [W, C]; the kernel
  // then computes y[t, c] = silu(sum_j w_ckpt[c, j] x[t - (W-1) + j, c]) (one
  // fresh sequence, so taps before the start read zeros).
  const int64_t C = 600;  // a whole channel chunk of the optimized kernel and a partial one
  const int W = 4;
  const int64_t T = 6;
  const std::vector<float> w_ckpt = Random(static_cast<size_t>(C * W), -1, 1, 21);
  const std::vector<float> w = ShortConvWeightFromCheckpoint(w_ckpt, C, W);
  ASSERT_EQ(w.size(), w_ckpt.size());
  EXPECT_EQ(w[1 * C + 5], w_ckpt[5 * W + 1]);
  const std::vector<float> x = Random(static_cast<size_t>(T * C), -2, 2, 22);
  std::vector<float> want(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int j = 0; j < W; ++j) {
        const int64_t i = t - (W - 1) + j;
        if (i >= 0) acc += static_cast<double>(w_ckpt[c * W + j]) * x[i * C + c];
      }
      want[t * C + c] = static_cast<float>(acc / (1.0 + std::exp(-acc)));
    }
  }
  const std::vector<int64_t> cu = {0, T};
  const std::vector<int32_t> idx = {0};
  const std::vector<uint8_t> fresh = {0};
  std::vector<float> y(static_cast<size_t>(T * C), 0.0F);
  std::vector<float> tails(static_cast<size_t>((W - 1) * C), 7.0F);
  RunShortConv({y.data(), DType::kF32}, {x.data(), DType::kF32}, {tails.data(), DType::kF32}, C, w, cu, C, W, 1, idx,
               fresh);
  EXPECT_TRUE(AllCloseF32(y.data(), want.data(), want.size()));
  ExpectErrorContaining([&] { ShortConvWeightFromCheckpoint(w_ckpt, C, W + 1); },
                        "checkpoint conv weight must be [C, W] = [600, 5]");
}

INSTANTIATE_TEST_SUITE_P(Kernels, ShortConvTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// ------------------------------------------------------------ gate, beta

class GateBetaTest : public VariantTest {};

// Every gate form: the softplus gate with beta = sigmoid, the lower-bound gate
// (GLM-5 Next, Bailing) and beta = 2 sigmoid (OLMo hybrid's negative
// eigenvalues), against float64 oracles.
TEST_P(GateBetaTest, MatchesOracleIncludingExtremes) {
  const int H = 3;
  const int K = 32;
  const int64_t T = 37;
  for (const GateForm form : {GateForm{}, GateForm{.lower_bound = -5.0F}, GateForm{.beta_scale = 2.0F},
                              GateForm{.lower_bound = -0.5F, .beta_scale = 2.0F}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " lower bound " + std::to_string(form.lower_bound) + " beta scale " +
                   std::to_string(form.beta_scale));
      std::vector<float> raw = Random(static_cast<size_t>(T * H * K), -60, 60, 4);
      raw[0] = 25.0F;  // softplus linear branch
      raw[1] = -200.0F;
      const std::vector<float> logits = Random(static_cast<size_t>(T * H), -30, 30, 5);
      const std::vector<float> a_log = {0.0F, 2.77F, -1.0F};
      const std::vector<float> dt_bias = Random(static_cast<size_t>(H) * K, -5, 5, 6);
      const ActBuffer rb = ToAct(dt, raw);
      const ActBuffer lb = ToAct(dt, logits);
      std::vector<float> g(raw.size()), beta(logits.size());
      if (variant().optimized()) {
        KdaGateBeta(g.data(), beta.data(), rb.view(), lb.view(), a_log.data(), dt_bias.data(), T, H, K, form);
      } else {
        KdaGateBetaReference(g.data(), beta.data(), rb.view(), lb.view(), a_log.data(), dt_bias.data(), T, H, K, form);
      }
      std::vector<float> want_g(raw.size()), want_beta(logits.size());
      for (size_t i = 0; i < raw.size(); ++i) {
        const size_t c = i % (static_cast<size_t>(H) * K);
        const float x = rb.Get(static_cast<int64_t>(i)) + dt_bias[c];  // the fp32 sum the kernels take
        const double a = std::exp(static_cast<double>(a_log[c / K]));
        // The lower-bound gate's fp32 argument, exp(A_log) * x, as the kernels take it.
        const float ax = std::exp(a_log[c / K]) * x;
        want_g[i] = static_cast<float>(form.lower_bound < 0 ? form.lower_bound * SigmoidF64(ax) : -a * SoftplusF64(x));
      }
      for (size_t i = 0; i < logits.size(); ++i)
        want_beta[i] = static_cast<float>(form.beta_scale * SigmoidF64(lb.Get(static_cast<int64_t>(i))));
      EXPECT_TRUE(AllCloseF32(g.data(), want_g.data(), want_g.size(), 1e-30, 1e-6));
      EXPECT_TRUE(AllCloseF32(beta.data(), want_beta.data(), want_beta.size(), 1e-12, 1e-6));
      if (form.lower_bound == 0) {
        EXPECT_EQ(g[1], 0.0F);  // softplus(-200 + bias) underflows fp32
      } else {
        for (float v : g) ASSERT_TRUE(v <= 0.0F && v >= form.lower_bound) << v;
      }
      if (variant().optimized()) {
        std::vector<float> g_ref(raw.size()), b_ref(logits.size());
        KdaGateBetaReference(g_ref.data(), b_ref.data(), rb.view(), lb.view(), a_log.data(), dt_bias.data(), T, H, K,
                             form);
        EXPECT_TRUE(AllCloseF32(g.data(), g_ref.data(), g_ref.size(), 1e-30, 1e-6));
        EXPECT_TRUE(AllCloseF32(beta.data(), b_ref.data(), b_ref.size(), 1e-12, 1e-6));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GateBetaTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// The in-kernel gate of the optimized KDA kernels (its reference is KdaGate per element).
class GateRowTest : public VariantTest {};

TEST_P(GateRowTest, MatchesKdaGateIncludingExtremes) {
  const int len = 131;  // not a whole number of vectors
  std::vector<float> raw = Random(static_cast<size_t>(len), -60, 60, 14);
  raw[0] = 25.0F;  // softplus linear branch
  raw[1] = -200.0F;
  raw[2] = 20.0F;
  const std::vector<float> bias = Random(static_cast<size_t>(len), -5, 5, 15);
  for (float a_log : {0.0F, 2.77F, -1.0F}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE("a_log " + std::to_string(a_log) + (with_bias ? " with bias" : ""));
      std::vector<float> want(raw.size());
      for (size_t d = 0; d < raw.size(); ++d) want[d] = KdaGate(with_bias ? raw[d] + bias[d] : raw[d], a_log);
      std::vector<float> got = raw;
      KdaGateRowInPlace(got.data(), with_bias ? bias.data() : nullptr, a_log, len);
      EXPECT_TRUE(AllCloseF32(got.data(), want.data(), want.size(), 1e-30, 1e-6));
      const float x0 = with_bias ? raw[0] + bias[0] : raw[0];  // > 20: softplus is the identity
      EXPECT_EQ(got[0], -std::exp(a_log) * x0);
      EXPECT_EQ(got[1], 0.0F);  // softplus(-200 + bias) underflows fp32, as in the reference
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GateRowTest, ::testing::ValuesIn(OptimizedVariants()), VariantParamName());

// ------------------------------------------------------------ gated RMSNorm

double SiluF64(double x) { return x * SigmoidF64(x); }

double GateF64(GateActivation act, double z) { return act == GateActivation::kSilu ? SiluF64(z) : SigmoidF64(z); }

// The float64 gated RMSNorm of rows [T*H, V] (the inputs as the kernels read them).
std::vector<double> GatedRmsNormF64(const ActBuffer& o, const ActBuffer& gate, const std::vector<float>& w,
                                    int64_t rows, int V, float eps, GateActivation act) {
  std::vector<double> want(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int d = 0; d < V; ++d) ss += static_cast<double>(o.Get(r * V + d)) * o.Get(r * V + d);
    const double rstd = 1.0 / std::sqrt(ss / V + eps);
    for (int d = 0; d < V; ++d) {
      want[r * V + d] = o.Get(r * V + d) * rstd * w[d] * GateF64(act, gate.Get(r * V + d));
    }
  }
  return want;
}

constexpr GateActivation kGateActivations[] = {GateActivation::kSigmoid, GateActivation::kSilu};

TEST(GateActivationTest, Names) {
  EXPECT_STREQ(GateActivationName(GateActivation::kSigmoid), "sigmoid");
  EXPECT_STREQ(GateActivationName(GateActivation::kSilu), "silu");
}

class GatedRmsNormTest : public VariantTest {
 protected:
  void Run(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps,
           GateActivation act) const {
    Pick(&GatedRmsNorm, &GatedRmsNormReference)(y, o, gate, w, T, H, V, eps, act);
  }
};

TEST_P(GatedRmsNormTest, MatchesOracle) {
  const int H = 4;
  const int64_t T = 9;
  for (GateActivation act : kGateActivations) {
    for (int V : {64, 37}) {  // 37: not a whole number of vectors
      for (DType dt : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::string(GateActivationName(act)) + " " + DTypeName(dt) + " V " + std::to_string(V));
        const float eps = 1e-5F;
        CheckGatedNormOnRandomInputs(
            dt, static_cast<size_t>(T * H * V), static_cast<size_t>(V), 7, variant().optimized(),
            [&](MutBuf y, ConstBuf o, ConstBuf gate, const float* w) { Run(y, o, gate, w, T, H, V, eps, act); },
            [&](MutBuf y, ConstBuf o, ConstBuf gate, const float* w) {
              GatedRmsNormReference(y, o, gate, w, T, H, V, eps, act);
            },
            [&](const ActBuffer& o, const ActBuffer& gate, const std::vector<float>& w) {
              return GatedRmsNormF64(o, gate, w, T * H, V, eps, act);
            });
      }
    }
  }
}

// One row by hand: o = (1, -2, 3, 0.5), gate = (0.5, -1, 2, 0), w = (1, 0.5, 2, 1.5),
// eps = 1e-6: mean(o^2) = 14.25 / 4 = 3.5625, rstd = 1 / sqrt(3.562501) = 0.52981287,
// silu(gate) = (0.31122967, -0.26894142, 1.76159416, 0), so
// y = o * rstd * w * silu(gate) = (0.16489348, 0.14248863, 5.59989152, 0); the
// sigmoid gate gives (0.32978696, -0.14248863, 2.79994576, 0.19867983).
TEST_P(GatedRmsNormTest, SiluOneRowByHand) {
  const std::vector<float> ov = {1.0F, -2.0F, 3.0F, 0.5F};
  const std::vector<float> gv = {0.5F, -1.0F, 2.0F, 0.0F};
  const std::vector<float> w = {1.0F, 0.5F, 2.0F, 1.5F};
  const float eps = 1e-6F;
  const std::vector<float> by_hand_silu = {0.16489348F, 0.14248863F, 5.59989152F, 0.0F};
  const std::vector<float> by_hand_sigmoid = {0.32978696F, -0.14248863F, 2.79994576F, 0.19867983F};
  // The same values from the formula in float64 (all four inputs exact in fp32).
  const double rstd = 1.0 / std::sqrt((1.0 + 4.0 + 9.0 + 0.25) / 4.0 + static_cast<double>(eps));
  std::vector<float> formula_silu(4), formula_sigmoid(4);
  for (size_t d = 0; d < 4; ++d) {
    const double z = gv[d];
    formula_silu[d] = static_cast<float>(ov[d] * rstd * w[d] * (z / (1.0 + std::exp(-z))));
    formula_sigmoid[d] = static_cast<float>(ov[d] * rstd * w[d] / (1.0 + std::exp(-z)));
  }
  EXPECT_TRUE(AllCloseF32(by_hand_silu.data(), formula_silu.data(), 4, 1e-7, 1e-7));
  EXPECT_TRUE(AllCloseF32(by_hand_sigmoid.data(), formula_sigmoid.data(), 4, 1e-7, 1e-7));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const ActBuffer o = ToAct(dt, ov);
    const ActBuffer gate = ToAct(dt, gv);
    for (GateActivation act : kGateActivations) {
      SCOPED_TRACE(GateActivationName(act));
      const std::vector<float>& want = act == GateActivation::kSilu ? formula_silu : formula_sigmoid;
      ActBuffer y(dt, 4);
      Run(y.mut(), o.view(), gate.view(), w.data(), 1, 1, 4, eps, act);
      const std::vector<float> got = y.ToFloat();
      if (dt == DType::kF32) {
        EXPECT_TRUE(AllCloseF32(got.data(), want.data(), 4, 1e-6, 1e-6));
      } else {
        // One rounding of the fp32 result: the bf16 value nearest the exact one
        // (none of the four lies near a bf16 tie).
        for (size_t d = 0; d < 4; ++d) EXPECT_EQ(got[d], RoundBF16(want[d])) << "d " << d;
      }
      if (act == GateActivation::kSilu) {
        EXPECT_EQ(got[3], 0.0F);  // silu(0) = 0
      }
      // silu(-1) < 0 flips the sign that sigmoid(-1) > 0 keeps.
      EXPECT_GT(got[1], act == GateActivation::kSilu ? 0.1F : -0.15F);
      EXPECT_LT(got[1], act == GateActivation::kSilu ? 0.15F : -0.1F);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GatedRmsNormTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// The optimized kernel against the reference on random shapes (odd V, row
// counts across the job boundaries), both activations, F32 and BF16.
class GatedRmsNormShapesTest : public VariantTest {};

TEST_P(GatedRmsNormShapesTest, MatchesReferenceOnRandomShapes) {
  std::mt19937 rng(21);
  const int odd_v[] = {1, 3, 7, 15, 17, 31, 33, 63, 65, 127, 129, 255};
  for (int trial = 0; trial < 24; ++trial) {
    // Half the trials an odd V of a vector's neighbourhood, half any V in [1, 300].
    const int V = trial % 2 == 0 ? odd_v[rng() % std::size(odd_v)] : 1 + static_cast<int>(rng() % 300);
    const int H = 1 + static_cast<int>(rng() % 6);
    const int64_t T = 1 + static_cast<int64_t>(rng() % 40);  // up to 240 rows: several jobs of 64
    const float eps = trial % 3 == 0 ? 1e-6F : 1e-5F;
    const size_t n = static_cast<size_t>(T * H * V);
    const std::vector<float> ov = Random(n, -3, 3, rng());
    const std::vector<float> gv = Random(n, -12, 12, rng());
    const std::vector<float> w = Random(static_cast<size_t>(V), -1.5F, 1.5F, rng());
    for (GateActivation act : kGateActivations) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::string(GateActivationName(act)) + " " + DTypeName(dt) + " T " + std::to_string(T) + " H " +
                     std::to_string(H) + " V " + std::to_string(V));
        const ActBuffer o = ToAct(dt, ov);
        const ActBuffer gate = ToAct(dt, gv);
        ActBuffer y(dt, T * H * V);
        ActBuffer y_ref(dt, T * H * V);
        GatedRmsNorm(y.mut(), o.view(), gate.view(), w.data(), T, H, V, eps, act);
        GatedRmsNormReference(y_ref.mut(), o.view(), gate.view(), w.data(), T, H, V, eps, act);
        const std::vector<double> want = GatedRmsNormF64(o, gate, w, T * H, V, eps, act);
        const std::vector<float> got = y.ToFloat();
        EXPECT_TRUE(CloseToReference(dt, got, y_ref.ToFloat(), want));
        EXPECT_TRUE(CloseToOracle(dt, got, want));
        EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](float v) { return v != 0.0F; }));  // real outputs
      }
    }
  }
}

TEST_P(GatedRmsNormShapesTest, RejectsAnUnknownActivation) {
  const ActBuffer o = ToAct(DType::kF32, {1.0F, 2.0F});
  ActBuffer y(DType::kF32, 2);
  const std::vector<float> w = {1.0F, 1.0F};
  const auto bad = static_cast<GateActivation>(7);
  ExpectErrorContaining([&] { GatedRmsNorm(y.mut(), o.view(), o.view(), w.data(), 1, 1, 2, 1e-6F, bad); },
                        "unknown gate activation 7");
  ExpectErrorContaining([&] { GatedRmsNormReference(y.mut(), o.view(), o.view(), w.data(), 1, 1, 2, 1e-6F, bad); },
                        "unknown gate activation 7");
}

INSTANTIATE_TEST_SUITE_P(Kernels, GatedRmsNormShapesTest, ::testing::ValuesIn(OptimizedVariants()), VariantParamName());

// ------------------------------------------------------------ Mamba2's gated RMSNorm (over groups)

// The float64 grouped norm of [T, groups * width] (the inputs as the kernels read them):
// g = o * silu(z), y = g * rsqrt(mean over the group(g^2) + eps) * w, w per channel of the row; the
// norm-then-gate form: o * rsqrt(mean(o^2) + eps) * w * silu(z); the gate alone: g.
std::vector<double> GatedRmsNormGroupsF64(const ActBuffer& o, const ActBuffer& z, const std::vector<float>& w,
                                          int64_t T, int groups, int64_t width, float eps,
                                          SsdNorm form = SsdNorm::kGateThenNorm) {
  std::vector<double> want(static_cast<size_t>(T * groups * width));
  std::vector<double> g(static_cast<size_t>(width));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < groups; ++j) {
      const int64_t base = (t * groups + j) * width;
      double ss = 0;
      for (int64_t c = 0; c < width; ++c) {
        const double ov = o.Get(base + c);
        g[c] = ov * SiluF64(z.Get(base + c));
        ss += form == SsdNorm::kNormThenGate ? ov * ov : g[c] * g[c];
      }
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(width) + eps);
      for (int64_t c = 0; c < width; ++c) {
        want[base + c] = form == SsdNorm::kGateOnly ? g[c] : g[c] * rstd * w[j * width + c];
      }
    }
  }
  return want;
}

class GatedRmsNormGroupsTest : public VariantTest {
 protected:
  void Run(MutBuf y, ConstBuf o, ConstBuf z, const float* w, int64_t T, int groups, int64_t width, float eps,
           SsdNorm form = SsdNorm::kGateThenNorm) const {
    Pick(&GatedRmsNormGroups, &GatedRmsNormGroupsReference)(y, o, z, w, T, groups, width, eps, form);
  }
};

TEST_P(GatedRmsNormGroupsTest, MatchesOracle) {
  const int64_t T = 5;
  for (int groups : {1, 2, 8}) {
    for (int64_t width : {64, 100, 24, 8192 / 8}) {  // 100, 24: not whole numbers of vectors
      for (auto [dt, form] : {std::pair{DType::kF32, SsdNorm::kGateThenNorm},
                              {DType::kBF16, SsdNorm::kGateThenNorm},
                              {DType::kF32, SsdNorm::kNormThenGate},
                              {DType::kBF16, SsdNorm::kNormThenGate},
                              {DType::kF32, SsdNorm::kGateOnly},
                              {DType::kBF16, SsdNorm::kGateOnly}}) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + " " + SsdNormName(form) + " groups " + std::to_string(groups) +
                     " width " + std::to_string(width));
        const float eps = 1e-5F;
        const SsdNorm norm_form = form;  // a copy: clang before 16 captures no structured binding
        CheckGatedNormOnRandomInputs(
            dt, static_cast<size_t>(T * groups * width), static_cast<size_t>(groups * width), 31, variant().optimized(),
            [&](MutBuf y, ConstBuf o, ConstBuf z, const float* w) {
              Run(y, o, z, w, T, groups, width, eps, norm_form);
            },
            [&](MutBuf y, ConstBuf o, ConstBuf z, const float* w) {
              GatedRmsNormGroupsReference(y, o, z, w, T, groups, width, eps, norm_form);
            },
            [&](const ActBuffer& o, const ActBuffer& z, const std::vector<float>& w) {
              return GatedRmsNormGroupsF64(o, z, w, T, groups, width, eps, norm_form);
            });
      }
    }
  }
}

// One token by hand, 2 groups of 2: o = (1, -2, 3, 0.5), z = (0.5, -1, 2, 0), w = (1, 0.5, 2, 1.5),
// eps = 1e-6: g = o * silu(z) = (0.31122967, 0.53788284, 5.28478247, 0); group 0's mean square
// 0.19309093, rstd 2.27571535, y = (0.70827013, 0.61203412); group 1's 13.96446287, rstd 0.26760108,
// y = (2.82842702, 0): one nonzero channel normalises to sqrt(width) * w. Per channel, not per group,
// the weight: group 1 reads w[2], w[3].
TEST_P(GatedRmsNormGroupsTest, TwoGroupsByHand) {
  const std::vector<float> ov = {1.0F, -2.0F, 3.0F, 0.5F};
  const std::vector<float> zv = {0.5F, -1.0F, 2.0F, 0.0F};
  const std::vector<float> w = {1.0F, 0.5F, 2.0F, 1.5F};
  const std::vector<float> by_hand = {0.70827013F, 0.61203412F, 2.82842702F, 0.0F};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const ActBuffer o = ToAct(dt, ov);
    const ActBuffer z = ToAct(dt, zv);
    const std::vector<double> formula = GatedRmsNormGroupsF64(o, z, w, 1, 2, 2, 1e-6F);
    const std::vector<float> f(formula.begin(), formula.end());
    EXPECT_TRUE(AllCloseF32(by_hand.data(), f.data(), 4, 1e-7, 1e-7));
    ActBuffer y(dt, 4);
    Run(y.mut(), o.view(), z.view(), w.data(), 1, 2, 2, 1e-6F);
    const std::vector<float> got = y.ToFloat();
    if (dt == DType::kF32) {
      EXPECT_TRUE(AllCloseF32(got.data(), by_hand.data(), 4, 1e-6, 1e-6));
    } else {
      for (size_t c = 0; c < 4; ++c) EXPECT_EQ(got[c], RoundBF16(by_hand[c])) << "c " << c;
    }
    EXPECT_EQ(got[3], 0.0F);  // silu(0) = 0
  }
}

// Large magnitudes (|o| up to 1e3, |z| up to 10: mean squares of 1e5 and more, where eps 1e-5 is
// nothing), a group of zeros (zeros out: 0 * rsqrt(eps)), a group whose gate is zero (silu(0) = 0),
// and a near-zero group (|o| ~ 1e-3, z ~ 1: mean square ~1e-7, where eps dominates rsqrt).
TEST_P(GatedRmsNormGroupsTest, LoudQuietAndZeroGroups) {
  const int64_t T = 3;
  const int groups = 4;
  for (int64_t width : {100, 1024}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " width " + std::to_string(width));
      const auto n = static_cast<size_t>(T * groups * width);
      std::vector<float> ov = Random(n, -1e3F, 1e3F, 41);
      std::vector<float> zv = Random(n, -10, 10, 42);
      const std::vector<float> w = Random(static_cast<size_t>(groups * width), -1.5F, 1.5F, 43);
      const auto span = [&](int64_t t, int j) { return (t * groups + j) * width; };  // the group's first element
      std::fill_n(ov.begin() + span(0, 1), width, 0.0F);                             // token 0, group 1: o = 0
      std::fill_n(zv.begin() + span(1, 2), width, 0.0F);                             // token 1, group 2: z = 0
      const std::vector<float> tiny = Random(static_cast<size_t>(width), -1e-3F, 1e-3F, 44);
      const std::vector<float> near_one = Random(static_cast<size_t>(width), 0.5F, 1.5F, 45);
      std::copy(tiny.begin(), tiny.end(), ov.begin() + span(2, 3));  // token 2, group 3: quiet
      std::copy(near_one.begin(), near_one.end(), zv.begin() + span(2, 3));
      const ActBuffer o = ToAct(dt, ov);
      const ActBuffer z = ToAct(dt, zv);
      const float eps = 1e-5F;
      ActBuffer y(dt, static_cast<int64_t>(n));
      Run(y.mut(), o.view(), z.view(), w.data(), T, groups, width, eps);
      const std::vector<double> want = GatedRmsNormGroupsF64(o, z, w, T, groups, width, eps);
      const std::vector<float> got = y.ToFloat();
      EXPECT_TRUE(CloseToOracle(dt, got, want));
      for (int64_t c = 0; c < width; ++c) {
        EXPECT_EQ(got[span(0, 1) + c], 0.0F) << "o = 0, c " << c;
        EXPECT_EQ(got[span(1, 2) + c], 0.0F) << "z = 0, c " << c;
      }
      // The loud group's mean square is far above eps; the quiet one's far below.
      double loud = 0, quiet = 0;
      for (int64_t c = 0; c < width; ++c) {
        const double gl = static_cast<double>(o.Get(span(0, 0) + c)) * SiluF64(z.Get(span(0, 0) + c));
        const double gq = static_cast<double>(o.Get(span(2, 3) + c)) * SiluF64(z.Get(span(2, 3) + c));
        loud += gl * gl / static_cast<double>(width);
        quiet += gq * gq / static_cast<double>(width);
      }
      EXPECT_GT(loud, 1e5);
      EXPECT_LT(quiet, 1e-6);
      // Without eps the quiet group would normalise to rms(y / w) = 1; eps keeps it near sqrt(quiet / eps).
      double rms = 0;
      for (int64_t c = 0; c < width; ++c) {
        const double v = got[span(2, 3) + c] / w[3 * width + c];
        rms += v * v / static_cast<double>(width);
      }
      EXPECT_NEAR(std::sqrt(rms), std::sqrt(quiet / (quiet + eps)), 0.02);
      EXPECT_LT(std::sqrt(rms), 0.35);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GatedRmsNormGroupsTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// A group's channels split over `parts` holders (tensor-parallel ranks), in two steps: each part's sums of
// squares, added, then each part normalised with the mean over the whole group, against the float64 norm of
// the whole rows; the sums of one part are those of its channels alone; bad arguments refused by name.
TEST(GatedRmsNormGroupsSplit, PartsWithSummedSquaresMatchTheWholeGroup) {
  const int64_t T = 6;
  const int groups = 2;
  const int64_t width = 96;
  for (int parts : {2, 4}) {
    for (auto [dt, form] : {std::pair{DType::kF32, SsdNorm::kGateThenNorm},
                            {DType::kBF16, SsdNorm::kGateThenNorm},
                            {DType::kF32, SsdNorm::kNormThenGate},
                            {DType::kBF16, SsdNorm::kNormThenGate}}) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " " + SsdNormName(form) + " parts " + std::to_string(parts));
      const auto n = static_cast<size_t>(T * groups * width);
      const ActBuffer o = ToAct(dt, Random(n, -4.0F, 4.0F, 61));
      const ActBuffer z = ToAct(dt, Random(n, -4.0F, 4.0F, 62));
      const std::vector<float> w = Random(static_cast<size_t>(groups * width), -1.5F, 1.5F, 63);
      const std::vector<float> ov = o.ToFloat();
      const std::vector<float> zv = z.ToFloat();
      const int64_t pw = width / parts;
      // Part p's rows [T, groups, pw] cut out of the whole ones, its weights likewise.
      const auto cut = [&](const std::vector<float>& v, int p, int64_t rows) {
        std::vector<float> c;
        for (int64_t r = 0; r < rows; ++r)
          c.insert(c.end(), v.begin() + r * width + p * pw, v.begin() + r * width + (p + 1) * pw);
        return c;
      };
      std::vector<ActBuffer> po;
      std::vector<ActBuffer> pz;
      std::vector<float> ss(static_cast<size_t>(T * groups), 0.0F);
      for (int p = 0; p < parts; ++p) {
        po.push_back(ToAct(dt, cut(ov, p, T * groups)));
        pz.push_back(ToAct(dt, cut(zv, p, T * groups)));
        std::vector<float> part(ss.size(), -1.0F);
        GatedRmsNormGroupsSquares(part.data(), po.back().view(), pz.back().view(), T, groups, pw, form);
        double first = 0;  // token 0, group 0 of this part, by hand
        for (int64_t c = 0; c < pw; ++c) {
          const double g =
              form == SsdNorm::kNormThenGate ? po.back().Get(c) : po.back().Get(c) * SiluF64(pz.back().Get(c));
          first += g * g;
        }
        EXPECT_NEAR(part[0], first, 1e-5 * first);
        for (size_t i = 0; i < ss.size(); ++i) ss[i] += part[i];
      }
      const std::vector<double> want = GatedRmsNormGroupsF64(o, z, w, T, groups, width, 1e-5F, form);
      std::vector<float> got(n);
      for (int p = 0; p < parts; ++p) {
        ActBuffer y(dt, T * groups * pw);
        const std::vector<float> pwts = cut(w, p, groups);
        GatedRmsNormGroupsFromSquares(y.mut(), po[p].view(), pz[p].view(), pwts.data(), ss.data(), width, T, groups, pw,
                                      1e-5F, form);
        const std::vector<float> yp = y.ToFloat();
        for (int64_t r = 0; r < T * groups; ++r) {
          std::copy(yp.begin() + r * pw, yp.begin() + (r + 1) * pw, got.begin() + r * width + p * pw);
        }
      }
      EXPECT_TRUE(CloseToOracle(dt, got, want));
    }
  }
  const ActBuffer o(DType::kF32, 4);
  const ActBuffer z(DType::kF32, 4);
  ActBuffer y(DType::kF32, 4);
  const float w[4] = {1, 1, 1, 1};
  float ss[2] = {1, 1};
  EXPECT_NE(testing::ErrorOf([&] {
              GatedRmsNormGroupsFromSquares(y.mut(), o.view(), z.view(), w, ss, 1, 2, 1, 2, 1e-5F,
                                            SsdNorm::kGateThenNorm);
            }).find("channel count 1 is below the width 2"),
            std::string::npos);
  EXPECT_NE(testing::ErrorOf([&] {
              GatedRmsNormGroupsSquares(nullptr, o.view(), z.view(), 2, 1, 2, SsdNorm::kGateThenNorm);
            }).find("ss is null"),
            std::string::npos);
  EXPECT_NE(testing::ErrorOf([&] {
              GatedRmsNormGroupsSquares(ss, o.view(), ActBuffer(DType::kBF16, 4).view(), 2, 1, 2,
                                        SsdNorm::kGateThenNorm);
            }).find("share a dtype"),
            std::string::npos);
}

// The optimized kernel against the reference on random shapes: groups 1, 2, 8, widths about a
// vector's size and odd ones up to 1100, token counts over several workers, F32 and BF16.
class GatedRmsNormGroupsShapesTest : public VariantTest {};

TEST_P(GatedRmsNormGroupsShapesTest, MatchesReferenceOnRandomShapes) {
  std::mt19937 rng(51);
  const int64_t odd_width[] = {1, 3, 7, 15, 17, 24, 31, 33, 63, 65, 100, 129, 255};
  const int group_counts[] = {1, 2, 8};
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t width =
        trial % 2 == 0 ? odd_width[rng() % std::size(odd_width)] : 1 + static_cast<int64_t>(rng() % 1100);
    const int groups = group_counts[trial % 3];
    const int64_t T = 1 + static_cast<int64_t>(rng() % 60);
    const float eps = trial % 3 == 0 ? 1e-6F : 1e-5F;
    const auto n = static_cast<size_t>(T * groups * width);
    const std::vector<float> ov = Random(n, -3, 3, rng());
    const std::vector<float> zv = Random(n, -12, 12, rng());
    const std::vector<float> w = Random(static_cast<size_t>(groups * width), -1.5F, 1.5F, rng());
    const auto form = static_cast<SsdNorm>((trial / 3) % 3);  // each form with each group count
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " " + SsdNormName(form) + " T " + std::to_string(T) + " groups " +
                   std::to_string(groups) + " width " + std::to_string(width));
      const ActBuffer o = ToAct(dt, ov);
      const ActBuffer z = ToAct(dt, zv);
      ActBuffer y(dt, static_cast<int64_t>(n));
      ActBuffer y_ref(dt, static_cast<int64_t>(n));
      GatedRmsNormGroups(y.mut(), o.view(), z.view(), w.data(), T, groups, width, eps, form);
      GatedRmsNormGroupsReference(y_ref.mut(), o.view(), z.view(), w.data(), T, groups, width, eps, form);
      const std::vector<double> want = GatedRmsNormGroupsF64(o, z, w, T, groups, width, eps, form);
      const std::vector<float> got = y.ToFloat();
      EXPECT_TRUE(CloseToReference(dt, got, y_ref.ToFloat(), want));
      EXPECT_TRUE(CloseToOracle(dt, got, want));
      EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](float v) { return v != 0.0F; }));  // real outputs
    }
  }
}

// A real model's row (Granite-4.0-H, Nemotron-H: one group of 8192), two tokens, both dtypes.
TEST_P(GatedRmsNormGroupsShapesTest, OneWideGroupMatchesReference) {
  const int64_t T = 2;
  const int64_t width = 8192;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const auto n = static_cast<size_t>(T * width);
    const ActBuffer o = ToAct(dt, Random(n, -3, 3, 61));
    const ActBuffer z = ToAct(dt, Random(n, -6, 6, 62));
    const std::vector<float> w = Random(static_cast<size_t>(width), 0.5F, 1.5F, 63);
    ActBuffer y(dt, static_cast<int64_t>(n));
    ActBuffer y_ref(dt, static_cast<int64_t>(n));
    GatedRmsNormGroups(y.mut(), o.view(), z.view(), w.data(), T, 1, width, 1e-5F);
    GatedRmsNormGroupsReference(y_ref.mut(), o.view(), z.view(), w.data(), T, 1, width, 1e-5F);
    const std::vector<double> want = GatedRmsNormGroupsF64(o, z, w, T, 1, width, 1e-5F);
    EXPECT_TRUE(CloseToOracle(dt, y.ToFloat(), want));
    EXPECT_TRUE(CloseToOracle(dt, y_ref.ToFloat(), want));
  }
}

TEST_P(GatedRmsNormGroupsShapesTest, RejectsBadArgumentsByName) {
  const ActBuffer o = ToAct(DType::kF32, {1.0F, 2.0F, 3.0F, 4.0F});
  const ActBuffer ob = ToAct(DType::kBF16, {1.0F, 2.0F, 3.0F, 4.0F});
  ActBuffer y(DType::kF32, 4);
  const std::vector<float> w = {1.0F, 1.0F, 1.0F, 1.0F};
  using Fn = void (*)(MutBuf, ConstBuf, ConstBuf, const float*, int64_t, int, int64_t, float, SsdNorm);
  for (Fn fn : {Fn{&GatedRmsNormGroups}, Fn{&GatedRmsNormGroupsReference}}) {
    const auto expect = [&](MutBuf yb, ConstBuf obuf, ConstBuf zb, const float* wp, int64_t T, int groups,
                            int64_t width, const std::string& what) {
      ExpectErrorContaining([&] { fn(yb, obuf, zb, wp, T, groups, width, 1e-5F, SsdNorm::kGateThenNorm); }, what);
    };
    ExpectErrorContaining([&] { fn(y.mut(), o.view(), o.view(), w.data(), 1, 2, 2, 1e-5F, static_cast<SsdNorm>(3)); },
                          "grouped RMSNorm: unknown form 3");
    fn(y.mut(), o.view(), o.view(), nullptr, 1, 2, 2, 1e-5F, SsdNorm::kGateOnly);  // the gate alone: no weight
    const ConstBuf oh{o.data(), DType::kF16};
    expect({y.data(), DType::kF16}, oh, oh, w.data(), 1, 2, 2, "grouped RMSNorm output must be F32 or BF16");
    expect(y.mut(), ob.view(), o.view(), w.data(), 1, 2, 2, "input, gate and output must share a dtype");
    expect(y.mut(), o.view(), ob.view(), w.data(), 1, 2, 2, "input, gate and output must share a dtype");
    expect(y.mut(), o.view(), o.view(), w.data(), -1, 2, 2, "T must be >= 0, got -1");
    expect(y.mut(), o.view(), o.view(), w.data(), 1, 0, 2, "groups must be positive, got 0");
    expect(y.mut(), o.view(), o.view(), w.data(), 1, 2, 0, "width must be positive, got 0");
    expect(y.mut(), o.view(), o.view(), w.data(), 1, 2, -3, "width must be positive, got -3");
    expect({nullptr, DType::kF32}, o.view(), o.view(), w.data(), 1, 2, 2, "output y is null");
    expect(y.mut(), {nullptr, DType::kF32}, o.view(), w.data(), 1, 2, 2, "input o is null");
    expect(y.mut(), o.view(), {nullptr, DType::kF32}, w.data(), 1, 2, 2, "gate z is null");
    expect(y.mut(), o.view(), o.view(), nullptr, 1, 2, 2, "weight w is null");
    // No tokens: nothing read or written, null pointers accepted.
    fn({nullptr, DType::kF32}, {nullptr, DType::kF32}, {nullptr, DType::kF32}, nullptr, 0, 2, 2, 1e-5F,
       SsdNorm::kGateThenNorm);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GatedRmsNormGroupsShapesTest, ::testing::ValuesIn(OptimizedVariants()),
                         VariantParamName());

// ------------------------------------------------------------ residual add

class ResidualAddTest : public VariantTest {};

TEST_P(ResidualAddTest, IsTheSumRoundedOnceBitForBit) {
  // Spans several parallel jobs and ends off a vector boundary.
  const int64_t n = 3 * (int64_t{1} << 16) + 7;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const ActBuffer x = ToAct(dt, Random(static_cast<size_t>(n), -4, 4, 11));
    const ActBuffer start = ToAct(dt, Random(static_cast<size_t>(n), -4, 4, 12));
    ActBuffer acc = ToAct(dt, start.ToFloat());
    if (variant().optimized()) {
      AddInPlace(acc.mut(), x.view(), n);
    } else {
      AddInPlaceReference(acc.mut(), x.view(), n);
    }
    ActBuffer want(dt, n);
    for (int64_t i = 0; i < n; ++i) want.Set(i, start.Get(i) + x.Get(i));  // summed in fp32, rounded once
    ASSERT_EQ(std::memcmp(acc.data(), want.data(), static_cast<size_t>(n) * DTypeSize(dt)), 0);
    EXPECT_NE(acc.Get(5), start.Get(5));
  }
}

TEST(ResidualAdd, RefusesMixedDtypesAndLeavesTheSumUntouched) {
  ActBuffer acc = ToAct(DType::kF32, {1.0F, 2.0F});
  const ActBuffer x = ToAct(DType::kBF16, {1.0F, 1.0F});
  EXPECT_THROW(AddInPlace(acc.mut(), x.view(), 2), Error);
  EXPECT_EQ(acc.Get(0), 1.0F);
  EXPECT_EQ(acc.Get(1), 2.0F);
}

INSTANTIATE_TEST_SUITE_P(Kernels, ResidualAddTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// ------------------------------------------------------------ bf16 conversions

// Values whose rounding is decided by the rule: ties both ways, the largest
// finite values (one rounds to infinity), infinities, signed zeros,
// subnormals, NaNs (quiet and signalling, both signs).
std::vector<float> RoundingCases() {
  std::vector<uint32_t> bits = {0x3f808000U, 0x3f818000U, 0x3f80c000U, 0x3f807fffU, 0x7f7fffffU, 0x7f7f7fffU,
                                0x7f800000U, 0xff800000U, 0x00000000U, 0x80000000U, 0x00000001U, 0x807fffffU,
                                0x7fc00000U, 0xffc00001U, 0x7f800001U, 0xff80ffffU, 0x7fffffffU, 0xc0490fdbU};
  std::vector<float> r;
  for (uint32_t b : bits) {
    float f = 0.0F;
    std::memcpy(&f, &b, sizeof(f));
    r.push_back(f);
  }
  const std::vector<float> random = Random(4099, -1e6F, 1e6F, 21);
  r.insert(r.end(), random.begin(), random.end());
  return r;
}

class Bf16ConvertTest : public VariantTest {};

TEST_P(Bf16ConvertTest, RoundsToNearestEvenBitExactly) {
  const std::vector<float> x = RoundingCases();
  const auto n = static_cast<int64_t>(x.size());
  std::vector<BF16> y(x.size());
  std::vector<float> back(x.size());
  if (variant().optimized()) {
    ConvertToBF16(y.data(), x.data(), n);
    ConvertToFloat(back.data(), y.data(), n);
  } else {
    ConvertToBF16Reference(y.data(), x.data(), n);
    ConvertToFloatReference(back.data(), y.data(), n);
  }
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u = 0;
    std::memcpy(&u, &x[i], sizeof(u));
    // The rule written out: NaN -> its upper half with the quiet bit; else round half to even.
    const bool nan = (u & 0x7fffffffU) > 0x7f800000U;
    const uint32_t lower = u & 0xffffU;
    uint32_t want = u >> 16;
    if (nan) {
      want |= 0x40U;
    } else if (lower > 0x8000U || (lower == 0x8000U && (want & 1U) != 0)) {
      ++want;
    }
    ASSERT_EQ(y[i].bits, want) << "element " << i << " bits 0x" << std::hex << u;
    uint32_t wide = 0;
    std::memcpy(&wide, &back[i], sizeof(wide));
    ASSERT_EQ(wide, want << 16) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16ConvertTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// ------------------------------------------------------------ vector math

class VecMathTest : public VariantTest {
 protected:
  std::vector<float> Apply(internal::VecMathOp op, const std::vector<float>& x) const {
    std::vector<float> y(x.size());
    internal::KernelsFor(variant().isa).vec_math(op, y.data(), x.data(), static_cast<int64_t>(x.size()));
    return y;
  }
};

TEST_P(VecMathTest, MatchesLibm) {
  using internal::VecMathOp;
  // 200003 points: whole vectors and a tail through the one-lane path.
  std::vector<float> xe, xl, xs;
  for (int i = 0; i <= 200002; ++i) {
    xe.push_back(std::min(88.0F, -87.0F + 175.0F * static_cast<float>(i) / 200002.0F));
    xl.push_back(std::ldexp(1.0F + static_cast<float>(i) / 200002.0F, (i % 60) - 30));
    xs.push_back(-40.0F + 80.0F * static_cast<float>(i) / 200002.0F);
  }
  const std::vector<float> e = Apply(VecMathOp::kExp, xe);
  const std::vector<float> l = Apply(VecMathOp::kLog, xl);
  const std::vector<float> sp = Apply(VecMathOp::kSoftplus, xs);
  const std::vector<float> sg = Apply(VecMathOp::kSigmoid, xs);
  const std::vector<float> si = Apply(VecMathOp::kSilu, xs);
  double worst_exp = 0, worst_log = 0, worst_sp = 0, worst_sg = 0, worst_si = 0;
  for (size_t i = 0; i < xe.size(); ++i) {
    const double we = std::exp(static_cast<double>(xe[i]));
    worst_exp = std::max(worst_exp, std::fabs(e[i] - we) / we);
    const double wl = std::log(static_cast<double>(xl[i]));
    worst_log = std::max(worst_log, std::fabs(l[i] - wl) / std::max(1.0, std::fabs(wl)));
    const double s = xs[i];
    worst_sp = std::max(worst_sp, std::fabs(sp[i] - SoftplusF64(s)) / SoftplusF64(s));
    worst_sg = std::max(worst_sg, std::fabs(sg[i] - SigmoidF64(s)) / SigmoidF64(s));
    worst_si = std::max(worst_si, std::fabs(si[i] - s * SigmoidF64(s)) / std::max(1e-30, std::fabs(s * SigmoidF64(s))));
  }
  EXPECT_LT(worst_exp, 3e-7);
  EXPECT_LT(worst_log, 2e-7);  // relative to max(1, |log y|), y in [2^-30, 2^30]
  EXPECT_LT(worst_sp, 5e-7);
  EXPECT_LT(worst_sg, 5e-7);
  EXPECT_LT(worst_si, 5e-7);

  // Edges, through the vector path (16 lanes) and the one-lane path (the 17th).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edge(17, -250.0F);
  edge[1] = -88.0F;  // below 2^-126: 0
  edge[2] = nan;
  edge[3] = 0.0F;
  edge[16] = nan;
  edge[15] = -inf;
  const std::vector<float> ee = Apply(VecMathOp::kExp, edge);
  EXPECT_EQ(ee[0], 0.0F);
  EXPECT_EQ(ee[1], 0.0F);
  EXPECT_TRUE(std::isnan(ee[2]));
  EXPECT_EQ(ee[3], 1.0F);
  EXPECT_EQ(ee[15], 0.0F);
  EXPECT_TRUE(std::isnan(ee[16]));
  EXPECT_EQ(Apply(VecMathOp::kSoftplus, {30.0F, -250.0F}), (std::vector<float>{30.0F, 0.0F}));
  for (float s : Apply(VecMathOp::kSigmoid, std::vector<float>(17, -250.0F))) {
    EXPECT_GE(s, 0.0F);
    EXPECT_LT(s, 1e-38F);  // 1 / (1 + e^88): e^x is clamped at 88
  }
  EXPECT_EQ(Apply(VecMathOp::kSigmoid, std::vector<float>(17, inf)), std::vector<float>(17, 1.0F));
}

TEST_P(VecMathTest, RoundsToBf16AsToBF16) {
  // The vector store (whole registers) and the one-lane store (the tail) against kda::ToBF16.
  const std::vector<float> x = RoundingCases();
  const std::vector<float> y = Apply(internal::VecMathOp::kRoundBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = RoundBF16(x[i]);
    uint32_t got_bits = 0;
    uint32_t want_bits = 0;
    std::memcpy(&got_bits, &y[i], sizeof(got_bits));
    std::memcpy(&want_bits, &want, sizeof(want_bits));
    ASSERT_EQ(got_bits, want_bits) << "element " << i << " = " << x[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, VecMathTest, ::testing::ValuesIn(OptimizedVariants()), VariantParamName());

}  // namespace
}  // namespace kda
