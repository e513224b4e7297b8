// The Q8 weight format: fp16 conversions, quantizer, checks, dequantizer,
// shards, and the plain reference product (kda/kernels/q8.h).
#include "kda/kernels/q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/error.h"
#include "kda/base/f16.h"

namespace kda {
namespace {

std::string BlockString(const std::string& name, int64_t cols, int64_t flat) {
  return name + " element [" + std::to_string(flat / cols) + ", " + std::to_string(flat % cols) + "]";
}

}  // namespace

uint16_t FloatToHalfBits(float f) { return ToF16(f).bits; }

float HalfBitsToFloat(uint16_t h) { return ToFloat(F16::FromBits(h)); }

Q8Weight QuantizeQ8(const std::vector<float>& w, int64_t rows, int64_t cols, const std::string& name) {
  Check(rows > 0 && cols > 0 && static_cast<int64_t>(w.size()) == rows * cols,
        "int8 weights: " + name + " has " + std::to_string(w.size()) + " values, expected " + std::to_string(rows) +
            " x " + std::to_string(cols));
  Check(cols % kQ8Block == 0, "int8 weights: " + name + " has input dim " + std::to_string(cols) +
                                  ", which is not a multiple of the block size 32");
  Q8Weight r;
  r.rows = rows;
  r.cols = cols;
  r.q.resize(w.size());
  r.scales.resize(static_cast<size_t>(rows * (cols / kQ8Block)));
  for (int64_t blk = 0; blk < rows * (cols / kQ8Block); ++blk) {
    const float* src = w.data() + blk * kQ8Block;
    float amax = 0.0F;
    for (int64_t j = 0; j < kQ8Block; ++j) {
      Check(std::isfinite(src[j]),
            [&] { return "int8 weights: " + BlockString(name, cols, blk * kQ8Block + j) + " is not finite"; });
      amax = std::max(amax, std::fabs(src[j]));
    }
    const uint16_t dh = FloatToHalfBits(amax / 127.0F);
    Check(dh != 0x7c00U, [&] {
      return "int8 weights: the scale of " + BlockString(name, cols, blk * kQ8Block) + "'s block (max |w| " +
             std::to_string(amax) + ") overflows fp16";
    });
    r.scales[blk] = dh;
    const float d = HalfBitsToFloat(dh);
    int8_t* dst = r.q.data() + blk * kQ8Block;
    for (int64_t j = 0; j < kQ8Block; ++j) {
      // std::round: half away from zero. d = 0 (a zero block, or a scale below
      // fp16's smallest subnormal) gives q = 0.
      const float v = d == 0.0F ? 0.0F : std::round(src[j] / d);
      dst[j] = static_cast<int8_t>(std::clamp(v, -127.0F, 127.0F));
    }
  }
  return r;
}

void CheckQ8Weight(const Q8Weight& w, const std::string& name) {
  Check(w.rows > 0 && w.cols > 0 && w.cols % kQ8Block == 0,
        "int8 weights: " + name + " has shape [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
            "]; its input dim must be a positive multiple of the block size 32");
  Check(static_cast<int64_t>(w.q.size()) == w.rows * w.cols &&
            static_cast<int64_t>(w.scales.size()) == w.rows * (w.cols / kQ8Block),
        "int8 weights: " + name + ": values or scales do not match its shape");
  const int64_t nb = w.cols / kQ8Block;
  for (size_t i = 0; i < w.scales.size(); ++i) {
    const float d = HalfBitsToFloat(w.scales[i]);
    Check(std::isfinite(d) && d >= 0.0F, [&] {
      return "int8 weights: " + name + " scale [" + std::to_string(static_cast<int64_t>(i) / nb) + ", " +
             std::to_string(static_cast<int64_t>(i) % nb) + "] is " +
             (std::isnan(d) ? std::string("nan") : std::to_string(d)) + "; scales must be finite and >= 0";
    });
  }
  for (size_t i = 0; i < w.q.size(); ++i) {
    Check(w.q[i] != -128, [&] {
      return "int8 weights: " + BlockString(name, w.cols, static_cast<int64_t>(i)) + " is -128, outside [-127, 127]";
    });
  }
}

std::vector<float> DequantizeQ8(const Q8Weight& w) {
  std::vector<float> r(w.q.size());
  for (size_t i = 0; i < w.q.size(); ++i) {
    r[i] = HalfBitsToFloat(w.scales[i / kQ8Block]) * static_cast<float>(w.q[i]);
  }
  return r;
}

Q8Weight SliceQ8(const Q8Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  Check(r0 >= 0 && r0 < r1 && r1 <= w.rows && c0 >= 0 && c0 < c1 && c1 <= w.cols && c0 % kQ8Block == 0 &&
            c1 % kQ8Block == 0,
        "int8 weights: slice out of range or not on 32-column blocks");
  Q8Weight r;
  r.rows = r1 - r0;
  r.cols = c1 - c0;
  const int64_t nb = w.cols / kQ8Block;
  for (int64_t row = r0; row < r1; ++row) {
    r.q.insert(r.q.end(), w.q.begin() + row * w.cols + c0, w.q.begin() + row * w.cols + c1);
    r.scales.insert(r.scales.end(), w.scales.begin() + row * nb + c0 / kQ8Block,
                    w.scales.begin() + row * nb + c1 / kQ8Block);
  }
  return r;
}

Q8Weight ConcatQ8Rows(const std::vector<const Q8Weight*>& parts) {
  Q8Weight r;
  Check(!parts.empty(), "int8 weights: nothing to concatenate");
  r.cols = parts.front()->cols;
  for (const Q8Weight* p : parts) {
    Check(p->cols == r.cols, "int8 weights: concatenated rows differ in length");
    r.rows += p->rows;
    r.q.insert(r.q.end(), p->q.begin(), p->q.end());
    r.scales.insert(r.scales.end(), p->scales.begin(), p->scales.end());
  }
  return r;
}

void Q8LinearReference(float* y, const float* x, const Q8Weight& w, int64_t m, bool round_bf16) {
  std::vector<float> deq = DequantizeQ8(w);
  if (round_bf16) {
    for (float& v : deq) v = RoundBF16(v);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) {
        s += static_cast<double>(x[i * w.cols + k]) * static_cast<double>(deq[n * w.cols + k]);
      }
      y[i * w.rows + n] = static_cast<float>(s);
    }
  }
}

WeightFormat ParseWeightFormat(const std::string& name) {
  if (name == "bf16") return WeightFormat::kDense;
  if (name == "int8") return WeightFormat::kInt8;
  throw Error("unknown weight format '" + name + "' (expected bf16 or int8)");
}

const char* WeightFormatName(WeightFormat f) { return f == WeightFormat::kInt8 ? "int8" : "bf16"; }

}  // namespace kda
