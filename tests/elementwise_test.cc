// The vectorised element-wise kernels against their plain references, and the
// vector math against libm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/short_conv.h"
#include "kernels/elementwise/vec_math.h"
#include "tests/error_util.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseF32;
using testing::ExpectErrorContaining;

TEST(VecMath, ExpLogSoftplusMatchLibm) {
  double worst_exp = 0;
  double worst_log = 0;
  double worst_sp = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0F + 175.0F * static_cast<float>(i) / 200000.0F;
    const double e = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(vecmath::ExpF(x) - e) / e);
    const float y = std::ldexp(1.0F + static_cast<float>(i) / 200000.0F, (i % 60) - 30);
    const double l = std::log(static_cast<double>(y));
    worst_log = std::max(worst_log, std::fabs(vecmath::LogF(y) - l) / std::max(1.0, std::fabs(l)));
    const float s = -40.0F + 80.0F * static_cast<float>(i) / 200000.0F;
    const double sp = s > 20 ? s : std::log1p(std::exp(static_cast<double>(s)));
    worst_sp = std::max(worst_sp, std::fabs(vecmath::SoftplusF(s) - sp) / sp);
  }
  EXPECT_LT(worst_exp, 3e-7);
  EXPECT_LT(worst_log, 2e-7);  // relative to max(1, |log y|), y in [2^-30, 2^30]
  EXPECT_LT(worst_sp, 5e-7);
  EXPECT_EQ(vecmath::ExpF(-250.0F), 0.0F);
  EXPECT_EQ(vecmath::SoftplusF(30.0F), 30.0F);
}

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

TEST(ShortConv, FastMatchesReference) {
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int W : {1, 2, 3, 4, 5}) {
      for (int64_t C : {16, 64, 200, 1100}) {  // 1100: two whole channel chunks and a partial one
        const std::vector<int64_t> cu = {0, 0, 1, 3, 70, 72};
        const int64_t N = 5;
        const int64_t T = cu.back();
        const int64_t stride = C + 8;  // x and tails with a row stride, as in the backend
        const std::vector<float> x = Random(static_cast<size_t>(T * stride), -3, 3, rng());
        const std::vector<float> w = Random(static_cast<size_t>(C * W), -1, 1, rng());
        const std::vector<float> tails = Random(static_cast<size_t>(7 * std::max(W - 1, 1) * stride), -2, 2, rng());
        const std::vector<int32_t> idx = {6, 2, -1, 5, 3};  // sequence 2 (tokens 1, 2) is padding
        const std::vector<uint8_t> has_init = {1, 0, 1, 1, 0};
        ActBuffer xb = ToAct(dt, x);
        ActBuffer t_ref = ToAct(dt, tails);
        ActBuffer t_fast = ToAct(dt, tails);
        ActBuffer y_ref(dt, T * C);
        ActBuffer y_fast(dt, T * C);
        ShortConvArgs a;
        a.x = xb.view();
        a.x_row_stride = stride;
        a.weight = w.data();
        a.cu_seqlens = cu.data();
        a.N = N;
        a.T = T;
        a.C = C;
        a.W = W;
        a.tail_row_stride = stride;
        a.num_tails = 7;
        a.tail_indices = idx.data();
        a.has_initial_state = has_init.data();
        a.y = y_ref.mut();
        a.tails = t_ref.mut();
        short_conv_silu_reference(a);
        a.y = y_fast.mut();
        a.tails = t_fast.mut();
        short_conv_silu(a);
        const std::vector<float> yr = y_ref.ToFloat();
        const std::vector<float> yf = y_fast.ToFloat();
        // Same fp32 sums; SiLU's exp differs from libm's by an ulp or two, which
        // can flip a bf16 rounding.
        if (dt == DType::kF32) {
          EXPECT_TRUE(AllCloseF32(yf.data(), yr.data(), yr.size(), 1e-6, 1e-6)) << "W " << W << " C " << C;
        } else {
          // The exact output: the fp32 reference on the same (bf16-exact) inputs.
          const ActBuffer x32 = ToAct(DType::kF32, xb.ToFloat());
          ActBuffer t32 = ToAct(DType::kF32, ToAct(dt, tails).ToFloat());
          ActBuffer y32(DType::kF32, T * C);
          ShortConvArgs e = a;
          e.x = x32.view();
          e.y = y32.mut();
          e.tails = t32.mut();
          short_conv_silu_reference(e);
          const std::vector<float> yx = y32.ToFloat();
          EXPECT_TRUE(testing::AllCloseBF16(yf.data(), yr.data(), yx.data(), yr.size())) << "W " << W << " C " << C;
        }
        EXPECT_EQ(t_fast.ToFloat(), t_ref.ToFloat()) << "W " << W << " C " << C;
        // Padding: zero outputs; the slots no sequence uses (0, 1, 4) keep their tails.
        for (int64_t i = cu[2] * C; i < cu[3] * C; ++i) {
          ASSERT_EQ(yr[i], 0.0F);
          ASSERT_EQ(yf[i], 0.0F);
        }
        const int64_t slot_size = (W - 1) * stride;
        const std::vector<float> t_after = t_fast.ToFloat();
        const std::vector<float> t_before = ToAct(dt, tails).ToFloat();
        for (int64_t slot : {0, 1, 4}) {
          for (int64_t i = slot * slot_size; i < (slot + 1) * slot_size; ++i) ASSERT_EQ(t_after[i], t_before[i]);
        }
      }
    }
  }
}

TEST(ShortConv, CheckpointWeightIsLaidOutTapMajor) {
  // A checkpoint conv1d weight [C, 1, W] laid out once as [W, C]; both kernels
  // then compute y[t, c] = silu(sum_j w_ckpt[c, j] x[t - (W-1) + j, c]) (one
  // fresh sequence, so taps before the start read zeros).
  const int64_t C = 600;  // a whole channel chunk of the fast kernel and a partial one
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
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "short_conv_silu" : "short_conv_silu_reference");
    std::vector<float> y(static_cast<size_t>(T * C), 0.0F);
    std::vector<float> tails(static_cast<size_t>((W - 1) * C), 7.0F);
    ShortConvArgs a;
    a.y = {y.data(), DType::kF32};
    a.x = {x.data(), DType::kF32};
    a.x_row_stride = C;
    a.weight = w.data();
    a.cu_seqlens = cu.data();
    a.N = 1;
    a.T = T;
    a.C = C;
    a.W = W;
    a.tails = {tails.data(), DType::kF32};
    a.tail_row_stride = C;
    a.num_tails = 1;
    a.tail_indices = idx.data();
    a.has_initial_state = fresh.data();
    if (fast) {
      short_conv_silu(a);
    } else {
      short_conv_silu_reference(a);
    }
    EXPECT_TRUE(AllCloseF32(y.data(), want.data(), want.size()));
  }
  ExpectErrorContaining([&] { ShortConvWeightFromCheckpoint(w_ckpt, C, W + 1); },
                        "checkpoint conv weight must be [C, W] = [600, 5]");
}

TEST(KdaGateBeta, FastMatchesReferenceIncludingExtremes) {
  const int H = 3;
  const int K = 32;
  const int64_t T = 37;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<float> raw = Random(static_cast<size_t>(T * H * K), -60, 60, 4);
    raw[0] = 25.0F;  // softplus linear branch
    raw[1] = -200.0F;
    const std::vector<float> logits = Random(static_cast<size_t>(T * H), -30, 30, 5);
    const std::vector<float> a_log = {0.0F, 2.77F, -1.0F};
    const std::vector<float> dt_bias = Random(static_cast<size_t>(H) * K, -5, 5, 6);
    const ActBuffer rb = ToAct(dt, raw);
    const ActBuffer lb = ToAct(dt, logits);
    std::vector<float> g_ref(raw.size()), g_fast(raw.size()), b_ref(logits.size()), b_fast(logits.size());
    KdaGateBetaReference(g_ref.data(), b_ref.data(), rb.view(), lb.view(), a_log.data(), dt_bias.data(), T, H, K);
    KdaGateBeta(g_fast.data(), b_fast.data(), rb.view(), lb.view(), a_log.data(), dt_bias.data(), T, H, K);
    EXPECT_TRUE(AllCloseF32(g_fast.data(), g_ref.data(), g_ref.size(), 1e-30, 1e-6));
    EXPECT_TRUE(AllCloseF32(b_fast.data(), b_ref.data(), b_ref.size(), 1e-12, 1e-6));
  }
}

TEST(KdaGateRowInPlace, MatchesKdaGateIncludingExtremes) {
  const int len = 131;  // not a whole number of vectors
  std::vector<float> raw = Random(static_cast<size_t>(len), -60, 60, 14);
  raw[0] = 25.0F;  // softplus linear branch
  raw[1] = -200.0F;
  raw[2] = 20.0F;
  const std::vector<float> bias = Random(static_cast<size_t>(len), -5, 5, 15);
  for (float a_log : {0.0F, 2.77F, -1.0F}) {
    for (bool with_bias : {true, false}) {
      std::vector<float> want(raw.size());
      for (size_t d = 0; d < raw.size(); ++d) want[d] = KdaGate(with_bias ? raw[d] + bias[d] : raw[d], a_log);
      std::vector<float> got = raw;
      KdaGateRowInPlace(got.data(), with_bias ? bias.data() : nullptr, a_log, len);
      EXPECT_TRUE(AllCloseF32(got.data(), want.data(), want.size(), 1e-30, 1e-6)) << a_log << " " << with_bias;
      const float x0 = with_bias ? raw[0] + bias[0] : raw[0];  // > 20: softplus is the identity
      EXPECT_EQ(got[0], -std::exp(a_log) * x0);
      EXPECT_EQ(got[1], 0.0F);  // softplus(-200 + bias) underflows fp32, as in the reference
    }
  }
}

TEST(GatedRmsNorm, FastMatchesReference) {
  const int H = 4;
  const int V = 64;
  const int64_t T = 9;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const ActBuffer o = ToAct(dt, Random(static_cast<size_t>(T * H * V), -2, 2, 7));
    const ActBuffer gate = ToAct(dt, Random(static_cast<size_t>(T * H * V), -8, 8, 8));
    const std::vector<float> w = Random(static_cast<size_t>(V), 0.5F, 1.5F, 9);
    ActBuffer y_ref(dt, T * H * V);
    ActBuffer y_fast(dt, T * H * V);
    GatedRmsNormReference(y_ref.mut(), o.view(), gate.view(), w.data(), T, H, V, 1e-5F);
    GatedRmsNorm(y_fast.mut(), o.view(), gate.view(), w.data(), T, H, V, 1e-5F);
    const std::vector<float> r = y_ref.ToFloat();
    const std::vector<float> f = y_fast.ToFloat();
    if (dt == DType::kF32) {
      EXPECT_TRUE(AllCloseF32(f.data(), r.data(), r.size(), 1e-6, 1e-6));
    } else {
      // The exact output: the fp32 reference on the same (bf16-exact) inputs.
      const ActBuffer o32 = ToAct(DType::kF32, o.ToFloat());
      const ActBuffer gate32 = ToAct(DType::kF32, gate.ToFloat());
      ActBuffer y32(DType::kF32, T * H * V);
      GatedRmsNormReference(y32.mut(), o32.view(), gate32.view(), w.data(), T, H, V, 1e-5F);
      const std::vector<float> x = y32.ToFloat();
      EXPECT_TRUE(testing::AllCloseBF16(f.data(), r.data(), x.data(), r.size()));
    }
  }
}

TEST(AddInPlace, FastMatchesReferenceBitForBit) {
  // Spans several parallel jobs and ends off a vector boundary.
  const int64_t n = 3 * (int64_t{1} << 16) + 7;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const ActBuffer x = ToAct(dt, Random(static_cast<size_t>(n), -4, 4, 11));
    const ActBuffer start = ToAct(dt, Random(static_cast<size_t>(n), -4, 4, 12));
    ActBuffer ref = ToAct(dt, start.ToFloat());
    ActBuffer fast = ToAct(dt, start.ToFloat());
    AddInPlaceReference(ref.mut(), x.view(), n);
    AddInPlace(fast.mut(), x.view(), n);
    ASSERT_EQ(std::memcmp(ref.data(), fast.data(), static_cast<size_t>(n) * DTypeSize(dt)), 0) << DTypeName(dt);
    // One value checked by hand: the sum rounded once.
    const float want = dt == DType::kBF16 ? RoundBF16(start.Get(5) + x.Get(5)) : start.Get(5) + x.Get(5);
    EXPECT_EQ(fast.Get(5), want);
    EXPECT_NE(fast.Get(5), start.Get(5));
  }
}

TEST(AddInPlace, RefusesMixedDtypesAndLeavesTheSumUntouched) {
  ActBuffer acc = ToAct(DType::kF32, {1.0F, 2.0F});
  const ActBuffer x = ToAct(DType::kBF16, {1.0F, 1.0F});
  EXPECT_THROW(AddInPlace(acc.mut(), x.view(), 2), Error);
  EXPECT_EQ(acc.Get(0), 1.0F);
  EXPECT_EQ(acc.Get(1), 2.0F);
}

}  // namespace
}  // namespace kda
