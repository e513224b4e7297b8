// Short conv + SiLU: validation, the plain reference, the checkpoint weight
// layout, and the host side of the optimized kernel (jobs of (sequence,
// channel chunk) over threads); its compute code is kernels/conv/short_conv_simd.cc,
// compiled per instruction set.
#include "kda/kernels/short_conv.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/dispatch.h"

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
  std::vector<int32_t> idx;  // the non-padding tail indices
  for (int64_t n = 0; n < a.N; ++n) {
    Check(a.cu_seqlens[n + 1] >= a.cu_seqlens[n], "short_conv: cu_seqlens must be non-decreasing");
    const int32_t i = a.tail_indices[n];
    Check(i < a.num_tails, "short_conv: tail index " + std::to_string(i) + " out of range");
    if (i >= 0) idx.push_back(i);
  }
  std::sort(idx.begin(), idx.end());
  Check(std::adjacent_find(idx.begin(), idx.end()) == idx.end(), "short_conv: two sequences share a tail");
}

}  // namespace

void short_conv_silu_reference(const ShortConvArgs& a) {
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
    if (a.tail_indices[n] < 0) {  // padding: zero outputs, no tail touched
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t c = c0; c < c1; ++c)
          StoreFromFloat(a.y.data, a.y.dtype, static_cast<size_t>((start + t) * a.C + c), 0.0F);
      }
      return;
    }
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
        for (int j = 0; j < W; ++j) acc += a.weight[j * a.C + c] * input(t - (W - 1) + j, c);
        if (a.bias != nullptr) acc += a.bias[c];  // after the taps, before the SiLU
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

void short_conv_silu(const ShortConvArgs& a) {
  using kc::kConvChunk;
  if (a.W > kc::kConvMaxWidth || a.y.dtype != a.x.dtype) {
    short_conv_silu_reference(a);
    return;
  }
  Validate(a);
  const internal::KernelTable& kernels = internal::ActiveKernels();
  const int64_t chunks = (a.C + kConvChunk - 1) / kConvChunk;
  ParallelFor(a.N * chunks, [&](int64_t job) {
    const int64_t n = job / chunks;
    const int64_t b = job % chunks;
    const int64_t c0 = b * kConvChunk;
    const int64_t nc = std::min(kConvChunk, a.C - c0);
    const float* w = a.weight + c0;  // tap j of channel c0 + lane at w[j * C + lane]
    if (a.x.dtype == DType::kBF16) {
      kernels.conv_chunk_bf16(a, w, n, c0, nc);
    } else {
      kernels.conv_chunk_f32(a, w, n, c0, nc);
    }
  });
}

std::vector<float> ShortConvWeightFromCheckpoint(const std::vector<float>& weight_cw, int64_t C, int W) {
  Check(C >= 1 && W >= 1 && static_cast<int64_t>(weight_cw.size()) == C * W,
        "short_conv: checkpoint conv weight must be [C, W] = [" + std::to_string(C) + ", " + std::to_string(W) +
            "], got " + std::to_string(weight_cw.size()) + " values");
  std::vector<float> wc(weight_cw.size());
  for (int64_t c = 0; c < C; ++c) {
    for (int j = 0; j < W; ++j) wc[j * C + c] = weight_cw[c * W + j];
  }
  return wc;
}

}  // namespace kda
