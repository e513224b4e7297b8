// A prefill task's working state of one head, shared by the optimized chunk kernels (chunk_kda_simd.cc, the
// recurrent form; chunk_ssd_simd.cc, the chunked form of Mamba2's SSD): its layout, and its loads from and stores
// to the stored states. Per-ISA sources only (after kernels/isa/vec.h).
#pragma once

#include <cstddef>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"
#include "kernels/kda/kda_tasks.h"
#include "kernels/kda/kda_vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// Offset of the task's head state in its sequence's [H, K, V] states.
KDA_INLINE size_t HeadStateOffset(const internal::ChunkTask& task) {
  const ChunkKdaArgs& a = *task.args;
  return static_cast<size_t>(task.h) * static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
}

// The working state of one head is [blocks][K'][block width] in its scratch
// (K' = K zero-padded, kda_tasks.h), each block contiguous (a [K][V] slice
// with a 512-byte row stride would alias in L1). Loads the head's columns of
// the initial state (read entirely before any write: it may alias the final
// state; zeros past K and V) and resets the row scales.
// The head's working state block by block: fn(c0, bw, real, w) for each block of at most NV registers of columns
// (c0 its first value column, bw its width, real its columns < V, w its [K'][bw] rows in the scratch).
template <class Vt, int NV, class Fn>
KDA_INLINE void ForEachStateBlock(const internal::ChunkTask& task, Fn&& fn) {
  constexpr int kB = NV * Vt::kLanes;
  const int kd = internal::PaddedKeyDim(task.args->K, Vt::kLanes);
  const int vd = task.args->V;
  const int width = task.v_end - task.v_begin;
  for (int col = 0; col < width; col += kB) {
    const int c0 = task.v_begin + col;
    const int bw = width - col < kB ? width - col : kB;
    const int real = c0 >= vd ? 0 : (vd - c0 < bw ? vd - c0 : bw);
    fn(c0, bw, real, task.scratch.state + static_cast<size_t>(kd) * col);
  }
}

template <class Vt, int NV>
void LoadState(const internal::ChunkTask& task) {
  constexpr int kL = Vt::kLanes;
  const ChunkKdaArgs& a = *task.args;
  const int kin = a.K;
  const int kd = internal::PaddedKeyDim(kin, kL);
  const int vd = a.V;
  const float* src = task.initial != nullptr ? task.initial + HeadStateOffset(task) : nullptr;
  ForEachStateBlock<Vt, NV>(task, [&](int c0, int bw, int real, float* w) {
    const auto at = [&](int d, int j) { return w + static_cast<size_t>(d) * bw + j; };
    if (src != nullptr && a.state_v_first) {  // the block's rows are columns of the stored [V][K] rows
      TransposeCopy<Vt>(
          src + static_cast<size_t>(c0) * kin, static_cast<size_t>(kin), real, kin,
          [&](int d, int j0, typename Vt::Reg x) { Vt::Store(at(d, j0), x); },
          [&](int d, int j, float x) { *at(d, j) = x; });
    } else if (src != nullptr) {
      for (int d = 0; d < kin; ++d) {
        const float* row = src + static_cast<size_t>(d) * vd + c0;
        int j = 0;
        for (; j + kL <= real; j += kL) Vt::Store(at(d, j), Vt::Load(row + j));
        for (; j < real; ++j) *at(d, j) = row[j];
      }
    }
    // Zeros past the stored state: its padded key rows and columns past V (all of it without one).
    for (int d = 0; d < kd; ++d) {
      for (int j = src != nullptr && d < kin ? real : 0; j < bw; ++j) *at(d, j) = 0.0F;
    }
  });
  for (int d = 0; d < kd; ++d) task.scratch.c[d] = 1.0F;
}

// Writes the head's state S = c * Shat, row by row, into the sequence's states
// `dst` [HV, K, V] ([HV, V, K] with state_v_first; its head and real columns),
// with the row scales `c` [K']: fp32, or rounded once to dst's BF16 or F16.
template <class Vt, int NV>
void StoreState(const internal::ChunkTask& task, const float* c_rows, const MutBuf& dst) {
  constexpr int kL = Vt::kLanes;
  const ChunkKdaArgs& a = *task.args;
  const int kin = a.K;
  const int vd = a.V;
  const size_t head = HeadStateOffset(task);
  ForEachStateBlock<Vt, NV>(task, [&](int c0, int bw, int real, const float* w) {
    if (a.state_v_first) {  // the block's columns are rows of the stored [V][K]
      const auto at = [&](int j, int d) { return head + static_cast<size_t>(c0 + j) * kin + d; };
      TransposeCopy<Vt>(
          w, static_cast<size_t>(bw), kin, real,
          [&](int j, int d0, typename Vt::Reg x) { StoreOut<Vt>(dst, at(j, d0), Vt::Mul(Vt::Load(c_rows + d0), x)); },
          [&](int j, int d, float x) { StoreScalar(dst, at(j, d), c_rows[d] * x); });
      return;
    }
    for (int d = 0; d < kin; ++d) {
      const float* wd = w + static_cast<size_t>(d) * bw;
      const size_t row = head + static_cast<size_t>(d) * vd + c0;
      int j = 0;
      for (; j + kL <= real; j += kL) StoreOut<Vt>(dst, row + j, Vt::Mul(Vt::Set1(c_rows[d]), Vt::Load(wd + j)));
      for (; j < real; ++j) StoreScalar(dst, row + j, c_rows[d] * wd[j]);
    }
  });
}

}  // namespace
}  // namespace kda::KDA_TARGET_NS
