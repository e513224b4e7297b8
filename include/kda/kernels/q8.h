// Int8 projection weights (Q8_0 semantics, weight-only): the format, its
// quantizer and dequantizer, and the fp16 scale conversions.
//
// A Linear weight W [N, K] (Hugging Face [out, in]) is cut into blocks of 32
// consecutive input-dim weights of one output row (K must be a multiple of
// 32). For each block: d = max|w| / 127 (fp32 division), stored as fp16
// rounded to nearest even; q = round-half-away-from-zero(w / fp16(d)) (fp32
// division) clamped to [-127, 127], and q = 0 for the whole block when
// fp16(d) = 0. The dequantized weight is exactly fp16(d) * q: an fp16 value
// (11 significant bits) times |q| <= 127 (7 bits) fits fp32's 24 bits.
//
// Activations are not quantized. A projection with Q8 weights computes, in
// fp32 accumulation, the product its pipeline would compute given the
// dequantized weights: the fp32 pipeline uses them as they are; the bf16
// pipeline, whose first cast point is the weights (design §2), uses
// bf16(fp16(d) * q), rounded to nearest even, exactly as a bf16 Linear rounds
// any weight it is given. So a Q8 layer equals the existing layer built from
// DequantizeQ8's values, up to the order of the fp32 sums.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kda {

inline constexpr int64_t kQ8Block = 32;

// fp32 -> fp16 bits, round to nearest even (overflow: +-inf; NaN: a quiet NaN).
uint16_t FloatToHalfBits(float f);
// fp16 bits -> fp32 (exact).
float HalfBitsToFloat(uint16_t h);

// One Linear weight in Q8 form: q [rows, cols] int8 row-major, scales
// [rows, cols / 32] fp16 bits (block b of row r at r * cols/32 + b).
struct Q8Weight {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;

  int64_t blocks_per_row() const { return cols / kQ8Block; }
  // Bytes streamed by a product with this weight (values and scales).
  int64_t bytes() const { return static_cast<int64_t>(q.size() + 2 * scales.size()); }
};

// Quantizes w [rows, cols] (row-major). kda::Error naming `name` when cols is
// not a multiple of 32, when w holds a NaN or infinity, or when a block's
// scale overflows fp16 (max|w| / 127 > 65504).
Q8Weight QuantizeQ8(const std::vector<float>& w, int64_t rows, int64_t cols, const std::string& name = "weight");

// Checks a Q8Weight built elsewhere (e.g. read from a checkpoint): sizes
// match rows x cols, cols a multiple of 32, every scale finite and >= 0, every
// q in [-127, 127]. kda::Error naming `name` and the first bad element.
void CheckQ8Weight(const Q8Weight& w, const std::string& name = "weight");

// The dequantized weight [rows, cols]: fp16(d) * q, exact in fp32.
std::vector<float> DequantizeQ8(const Q8Weight& w);

// Rows [r0, r1) x columns [c0, c1) of a Q8 weight (c0 and c1 multiples of
// 32): a tensor-parallel shard, equal to quantizing the same block of the
// dequantized values.
Q8Weight SliceQ8(const Q8Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

// The rows of `parts` one after another (all with the same cols).
Q8Weight ConcatQ8Rows(const std::vector<const Q8Weight*>& parts);

// The plain reference of a Q8 projection: y [m, rows] (fp32) = x [m, cols]
// . W^T with W = DequantizeQ8(w), each weight rounded to bf16 first when
// round_bf16 (the bf16 pipeline), sums in double. x is fp32 [m * cols].
void Q8LinearReference(float* y, const float* x, const Q8Weight& w, int64_t m, bool round_bf16);

// Weight format of the projections: as the pipeline casts them (the
// checkpoint's values; bf16 in the bf16 pipeline), or Q8.
enum class WeightFormat : uint8_t { kDense, kInt8 };

// "bf16" (kDense) or "int8"; the parser throws kda::Error naming any other.
WeightFormat ParseWeightFormat(const std::string& name);
const char* WeightFormatName(WeightFormat f);

}  // namespace kda
