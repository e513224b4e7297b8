#include "kda/kernels/short_conv.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kernels/elementwise/vec_math.h"

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

namespace {

constexpr int kMaxWidth = 16;          // conv widths beyond this take the reference path
constexpr int64_t kChunk = 512;        // channels per job
constexpr int kConvPrefetchAhead = 2;  // tokens
constexpr int kMaxRegisterWidth = 4;   // widths summed in registers (Kimi-Linear's is 4)

// Tokens [t0, t1) of a job whose taps are all input rows (t0 >= kW - 1): one
// pass per token with the sums in registers, taps oldest first as the
// reference sums them, and the row kConvPrefetchAhead tokens ahead prefetched
// (rows are a row stride apart, a page or more, beyond the hardware
// prefetchers' reach). x_c0: row 0 of the sequence at the job's first channel.
template <int kW, class T>
[[gnu::always_inline]] inline void ConvTokensInRegisters(T* y_c0, int64_t y_stride, const T* x_c0, int64_t x_stride,
                                                         const float* wt, int64_t w_stride, int64_t nc, int64_t t0,
                                                         int64_t t1) {
  using vecmath::LoadF;
  using vecmath::SiluF;
  using vecmath::StoreF;
  for (int64_t t = t0; t < t1; ++t) {
    const T* cur = x_c0 + t * x_stride;  // tap kW-1
    if (t + kConvPrefetchAhead < t1) {
      const char* ahead = reinterpret_cast<const char*>(cur + kConvPrefetchAhead * x_stride);
      for (int64_t byte = 0; byte < nc * static_cast<int64_t>(sizeof(T)); byte += 64) __builtin_prefetch(ahead + byte);
    }
    T* yrow = y_c0 + t * y_stride;
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) {
      float acc = 0.0F;
      for (int j = 0; j < kW; ++j) acc += wt[j * w_stride + c] * LoadF(cur[(j - (kW - 1)) * x_stride + c]);
      StoreF(yrow + c, SiluF(acc));
    }
  }
}

// One job: channels [c0, c0 + nc) of sequence n, token by token. Each tap
// reads the projection rows in place; only the first W-1 tokens reach into
// the tail (copied as fp32 into tail_rows). Widths up to kMaxRegisterWidth sum
// the other tokens in registers; wider ones take the general pass throughout.
template <class T>
[[gnu::always_inline]] inline void ConvChunk(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0,
                                             int64_t nc) {
  using vecmath::LoadF;
  using vecmath::SiluF;
  using vecmath::StoreF;
  const int W = a.W;
  const T* x = static_cast<const T*>(a.x.data);
  T* y = static_cast<T*>(a.y.data);
  const int64_t start = a.cu_seqlens[n];
  const int64_t len = a.cu_seqlens[n + 1] - start;
  if (a.tail_indices[n] < 0) {  // padding: zero outputs, no tail touched
    for (int64_t t = 0; t < len; ++t) {
      T* yrow = y + (start + t) * a.C + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) StoreF(yrow + c, 0.0F);
    }
    return;
  }
  const bool fresh = a.has_initial_state != nullptr && a.has_initial_state[n] == 0;
  T* tail =
      W > 1 ? static_cast<T*>(a.tails.data) + static_cast<int64_t>(a.tail_indices[n]) * (W - 1) * a.tail_row_stride + c0
            : nullptr;
  // rows[r] for r in [0, W-1 + len): input row r - (W-1) of the sequence, as
  // fp32 for the tail rows (a small copy) and in place for the rest.
  alignas(64) float tail_rows[kMaxWidth][kChunk];
  for (int r = 0; r < W - 1; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) tail_rows[r][c] = fresh ? 0.0F : LoadF(tail[r * a.tail_row_stride + c]);
  }
  // Tokens whose taps are all input rows: in registers at the usual widths.
  int64_t general_end = len;  // tokens [0, general_end) take the general pass below
  if (W <= kMaxRegisterWidth) {
    general_end = std::min<int64_t>(W - 1, len);
    T* y_c0 = y + start * a.C + c0;
    const T* x_c0 = x + start * a.x_row_stride + c0;
    switch (W) {
      case 1:
        ConvTokensInRegisters<1>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, nc, general_end, len);
        break;
      case 2:
        ConvTokensInRegisters<2>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, nc, general_end, len);
        break;
      case 3:
        ConvTokensInRegisters<3>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, nc, general_end, len);
        break;
      default:
        ConvTokensInRegisters<kMaxRegisterWidth>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, nc, general_end, len);
        break;
    }
  }
  alignas(64) float acc[kChunk];
  for (int64_t t = 0; t < general_end; ++t) {
    // Taps oldest first, as the reference sums them.
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) acc[c] = 0.0F;
    for (int j = 0; j < W; ++j) {
      const int64_t i = t - (W - 1) + j;  // input row of this tap
      const float* wj = wt + j * a.C;
      if (i >= 0) {
        const T* row = x + (start + i) * a.x_row_stride + c0;
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) acc[c] += wj[c] * LoadF(row[c]);
      } else {
        const float* row = tail_rows[W - 1 + i];
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) acc[c] += wj[c] * row[c];
      }
    }
    T* yrow = y + (start + t) * a.C + c0;
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) StoreF(yrow + c, SiluF(acc[c]));
  }
  // New tail: the last W-1 rows of [old tail; inputs], all read before any is written.
  alignas(64) float new_tail[kMaxWidth][kChunk];
  for (int r = 0; r < W - 1; ++r) {
    const int64_t i = len - (W - 1) + r;
    if (i >= 0) {
      const T* row = x + (start + i) * a.x_row_stride + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) new_tail[r][c] = LoadF(row[c]);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) new_tail[r][c] = tail_rows[W - 1 + i][c];
    }
  }
  for (int r = 0; r < W - 1; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) StoreF(tail + r * a.tail_row_stride + c, new_tail[r][c]);
  }
}

#define KDA_CONV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// wt: the job's first channel in the [W, C] weight (taps C apart).
KDA_CONV_CLONES void ConvChunkF32(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) {
  ConvChunk<float>(a, wt, n, c0, nc);
}
KDA_CONV_CLONES void ConvChunkBF16(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) {
  ConvChunk<BF16>(a, wt, n, c0, nc);
}

}  // namespace

void short_conv_silu(const ShortConvArgs& a) {
  if (a.W > kMaxWidth || a.y.dtype != a.x.dtype) {
    short_conv_silu_reference(a);
    return;
  }
  Validate(a);
  const int64_t chunks = (a.C + kChunk - 1) / kChunk;
  ParallelFor(a.N * chunks, [&](int64_t job) {
    const int64_t n = job / chunks;
    const int64_t b = job % chunks;
    const int64_t c0 = b * kChunk;
    const int64_t nc = std::min(kChunk, a.C - c0);
    const float* w = a.weight + c0;  // tap j of channel c0 + lane at w[j * C + lane]
    if (a.x.dtype == DType::kBF16) {
      ConvChunkBF16(a, w, n, c0, nc);
    } else {
      ConvChunkF32(a, w, n, c0, nc);
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
