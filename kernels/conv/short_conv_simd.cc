// The optimized short conv + SiLU compute code, compiled once per
// instruction set (kernels/isa/target.h): one job is channels [c0, c0 + nc)
// of one sequence. Host side and plain reference: short_conv.cc.
#include "kda/kernels/short_conv.h"

#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

using kc::kConvPrefetchAhead;
constexpr int kMaxWidth = kc::kConvMaxWidth;
constexpr int64_t kChunk = kc::kConvChunk;
constexpr int kMaxRegisterWidth = kc::kConvMaxRegisterWidth;

// Tokens [t0, t1) of a job whose taps are all input rows (t0 >= kW - 1): one
// pass per token with the sums in registers, taps oldest first as the
// reference sums them, and the row kConvPrefetchAhead tokens ahead prefetched
// (rows are a row stride apart, a page or more, beyond the hardware
// prefetchers' reach). x_c0: row 0 of the sequence at the job's first channel;
// bias [nc]: the job's bias, added to each sum before the SiLU.
template <int kW, class T>
KDA_INLINE void ConvTokensInRegisters(T* y_c0, int64_t y_stride, const T* x_c0, int64_t x_stride, const float* wt,
                                      int64_t w_stride, const float* bias, int64_t nc, int64_t t0, int64_t t1) {
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
      StoreF(yrow + c, Silu<Scalar>(acc + bias[c]));
    }
  }
}

// One job: channels [c0, c0 + nc) of sequence n, token by token. Each tap
// reads the projection rows in place; only the first W-1 tokens reach into
// the tail (copied as fp32 into tail_rows). Widths up to kMaxRegisterWidth sum
// the other tokens in registers; wider ones take the general pass throughout.
template <class T>
KDA_INLINE void ConvChunk(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) {
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
  // The sequence's tail (W - 1 >= 0 rows, W >= 1 validated): none at W = 1.
  T* tail = nullptr;
  int tail_len = 0;
  if (W > 1) {
    tail = static_cast<T*>(a.tails.data) + static_cast<int64_t>(a.tail_indices[n]) * (W - 1) * a.tail_row_stride + c0;
    tail_len = W - 1;
  }
  // The job's bias, read once; without one, -0.0, which leaves every sum
  // unchanged bit for bit (s + -0.0 == s, s = +0.0 included).
  alignas(64) float bias[kChunk];
#pragma omp simd
  for (int64_t c = 0; c < nc; ++c) bias[c] = a.bias != nullptr ? a.bias[c0 + c] : -0.0F;
  // rows[r] for r in [0, W-1 + len): input row r - (W-1) of the sequence, as
  // fp32 for the tail rows (a small copy) and in place for the rest.
  alignas(64) float tail_rows[kMaxWidth][kChunk];
  for (int r = 0; r < tail_len; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) tail_rows[r][c] = fresh ? 0.0F : LoadF(tail[r * a.tail_row_stride + c]);
  }
  // Tokens whose taps are all input rows: in registers at the usual widths.
  int64_t general_end = len;  // tokens [0, general_end) take the general pass below
  if (W <= kMaxRegisterWidth) {
    general_end = W - 1 < len ? W - 1 : len;
    T* y_c0 = y + start * a.C + c0;
    const T* x_c0 = x + start * a.x_row_stride + c0;
    switch (W) {
      case 1:
        ConvTokensInRegisters<1>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, bias, nc, general_end, len);
        break;
      case 2:
        ConvTokensInRegisters<2>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, bias, nc, general_end, len);
        break;
      case 3:
        ConvTokensInRegisters<3>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, bias, nc, general_end, len);
        break;
      default:
        ConvTokensInRegisters<kMaxRegisterWidth>(y_c0, a.C, x_c0, a.x_row_stride, wt, a.C, bias, nc, general_end, len);
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
    for (int64_t c = 0; c < nc; ++c) StoreF(yrow + c, Silu<Scalar>(acc[c] + bias[c]));
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
  for (int r = 0; r < tail_len; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) StoreF(tail + r * a.tail_row_stride + c, new_tail[r][c]);
  }
}

}  // namespace

// wt: the job's first channel in the [W, C] weight (taps C apart).
void ConvChunkF32(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) {
  ConvChunk<float>(a, wt, n, c0, nc);
}
void ConvChunkBF16(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) {
  ConvChunk<BF16>(a, wt, n, c0, nc);
}

}  // namespace kda::KDA_TARGET_NS
