#include "kda/kernels/short_conv.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "kda/base/parallel.h"

namespace kda {
namespace {

void Validate(const ShortConvArgs& a) {
  Check(a.N >= 1 && a.C >= 1 && a.W >= 1 && a.T >= 0, "short_conv: invalid sizes");
  Check(a.x.dtype == DType::kF32 || a.x.dtype == DType::kBF16, "short_conv: x must be F32 or BF16");
  Check(a.y.dtype == DType::kF32 || a.y.dtype == DType::kBF16, "short_conv: y must be F32 or BF16");
  Check(a.tails.dtype == a.x.dtype, "short_conv: tails must have the dtype of x");
  Check(a.x_row_stride >= a.C && (a.W == 1 || a.tail_row_stride >= a.C), "short_conv: row stride below C");
  Check(a.weight != nullptr && a.cu_seqlens != nullptr && a.tail_indices != nullptr, "short_conv: null argument");
  Check(a.T == 0 || (a.x.data != nullptr && a.y.data != nullptr), "short_conv: null input or output");
  Check(a.W == 1 || a.tails.data != nullptr, "short_conv: null tails");
  Check(a.cu_seqlens[0] == 0 && a.cu_seqlens[a.N] == a.T, "short_conv: cu_seqlens must run from 0 to T");
  std::vector<int32_t> idx(a.tail_indices, a.tail_indices + a.N);
  for (int64_t n = 0; n < a.N; ++n) {
    Check(a.cu_seqlens[n + 1] >= a.cu_seqlens[n], "short_conv: cu_seqlens must be non-decreasing");
    Check(idx[n] >= 0 && idx[n] < a.num_tails, "short_conv: tail index " + std::to_string(idx[n]) + " out of range");
  }
  std::sort(idx.begin(), idx.end());
  Check(std::adjacent_find(idx.begin(), idx.end()) == idx.end(), "short_conv: two sequences share a tail");
}

}  // namespace

void short_conv_silu(const ShortConvArgs& a) {
  Validate(a);
  const int W = a.W;
  constexpr int64_t kBlock = 256;  // channels per job
  const int64_t blocks = (a.C + kBlock - 1) / kBlock;
  ParallelFor(a.N * blocks, [&](int64_t job) {
    const int64_t n = job / blocks;
    const int64_t c0 = (job % blocks) * kBlock;
    const int64_t c1 = std::min(a.C, c0 + kBlock);
    const int64_t start = a.cu_seqlens[n];
    const int64_t len = a.cu_seqlens[n + 1] - start;
    const bool fresh = a.has_initial_state != nullptr && a.has_initial_state[n] == 0;
    const int64_t tail_base = static_cast<int64_t>(a.tail_indices[n]) * (W - 1) * a.tail_row_stride;
    // Input row i of the sequence, i in [-(W-1), len): the tail for i < 0.
    auto input = [&](int64_t i, int64_t c) -> float {
      if (i >= 0) return LoadAsFloat(a.x.data, a.x.dtype, static_cast<size_t>((start + i) * a.x_row_stride + c));
      if (fresh) return 0.0F;
      return LoadAsFloat(a.tails.data, a.tails.dtype,
                         static_cast<size_t>(tail_base + (W - 1 + i) * a.tail_row_stride + c));
    };
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t c = c0; c < c1; ++c) {
        float acc = 0.0F;
        for (int j = 0; j < W; ++j) acc += a.weight[c * W + j] * input(t - (W - 1) + j, c);
        const float silu = acc / (1.0F + std::exp(-acc));
        StoreFromFloat(a.y.data, a.y.dtype, static_cast<size_t>((start + t) * a.C + c), silu);
      }
    }
    // New tail, computed whole before it overwrites the old one.
    std::vector<float> tail(static_cast<size_t>((W - 1) * (c1 - c0)));
    for (int r = 0; r < W - 1; ++r) {
      for (int64_t c = c0; c < c1; ++c) tail[r * (c1 - c0) + (c - c0)] = input(len - (W - 1) + r, c);
    }
    for (int r = 0; r < W - 1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        StoreFromFloat(a.tails.data, a.tails.dtype, static_cast<size_t>(tail_base + r * a.tail_row_stride + c),
                       tail[r * (c1 - c0) + (c - c0)]);
      }
    }
  });
}

}  // namespace kda
