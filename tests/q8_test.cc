// The Q8 weight format (kda/kernels/q8.h): fp16 conversions, the quantizer on
// hand-made blocks (ties, zero blocks, clamp, fp16 rounding of the scale,
// subnormal scales), its checks of bad input, shards. The Q8 Linear is tested
// in linear_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/kernels/linear.h"
#include "kda/kernels/q8.h"
#include "tests/error_util.h"

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

}  // namespace
}  // namespace kda
