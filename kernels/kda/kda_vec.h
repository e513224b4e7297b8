// Loads and stores of the optimized KDA kernels' F32, BF16 or F16 buffers, shared
// by chunk_kda_simd.cc and fused_recurrent_kda_simd.cc (per-ISA sources; see
// kernels/isa/target.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// Element i of an F32, BF16 or F16 buffer.
KDA_INLINE float LoadScalar(const ConstBuf& buf, size_t i) {
  if (buf.dtype == DType::kBF16) return LoadBF16<Scalar>(static_cast<const BF16*>(buf.data) + i);
  if (buf.dtype == DType::kF16) return LoadF16<Scalar>(static_cast<const F16*>(buf.data) + i);
  return static_cast<const float*>(buf.data)[i];
}

// Lanes [i, i + lanes) of an F32, BF16 or F16 buffer as fp32.
template <class Vt>
KDA_INLINE typename Vt::Reg LoadAt(const ConstBuf& buf, size_t i) {
  if (buf.dtype == DType::kBF16) return LoadBF16<Vt>(static_cast<const BF16*>(buf.data) + i);
  if (buf.dtype == DType::kF16) return LoadF16<Vt>(static_cast<const F16*>(buf.data) + i);
  return Vt::Load(static_cast<const float*>(buf.data) + i);
}

// out[0, len) = buf[offset, offset + len) as fp32; len is a multiple of the lanes.
template <class Vt>
KDA_INLINE void LoadRow(const ConstBuf& buf, size_t offset, int len, float* out) {
  for (int d = 0; d < len; d += Vt::kLanes) Vt::Store(out + d, LoadAt<Vt>(buf, offset + d));
}

// out[0, padded) = buf[offset, offset + len) as fp32, then zeros (len <= padded, padded a multiple of the lanes).
template <class Vt>
KDA_INLINE void LoadRowPadded(const ConstBuf& buf, size_t offset, int len, int padded, float* out) {
  int d = 0;
  for (; d + Vt::kLanes <= len; d += Vt::kLanes) Vt::Store(out + d, LoadAt<Vt>(buf, offset + d));
  for (; d < len; ++d) out[d] = LoadScalar(buf, offset + d);
  for (; d < padded; ++d) out[d] = 0.0F;
}

// Element i of an F32, BF16 or F16 output, rounded once.
KDA_INLINE void StoreScalar(const MutBuf& buf, size_t i, float x) {
  if (buf.dtype == DType::kBF16) {
    StoreBF16<Scalar>(static_cast<BF16*>(buf.data) + i, x);
  } else if (buf.dtype == DType::kF16) {
    StoreF16<Scalar>(static_cast<F16*>(buf.data) + i, x);
  } else {
    static_cast<float*>(buf.data)[i] = x;
  }
}

// buf[offset + j] = x[j] for the lanes of one register (F32, BF16 or F16 output).
template <class Vt>
KDA_INLINE void StoreOut(const MutBuf& buf, size_t offset, typename Vt::Reg x) {
  if (buf.dtype == DType::kBF16) {
    StoreBF16<Vt>(static_cast<BF16*>(buf.data) + offset, x);
  } else if (buf.dtype == DType::kF16) {
    StoreF16<Vt>(static_cast<F16*>(buf.data) + offset, x);
  } else {
    Vt::Store(static_cast<float*>(buf.data) + offset, x);
  }
}

// The first n lanes of x (n < lanes) to buf[offset, offset + n).
template <class Vt>
KDA_INLINE void StoreOutPart(const MutBuf& buf, size_t offset, typename Vt::Reg x, int n) {
  alignas(64) float lanes[Vt::kLanes];
  Vt::Store(lanes, x);
  for (int j = 0; j < n; ++j) StoreScalar(buf, offset + j, lanes[j]);
}

// The transposed copy of src [rows][cols] (fp32, row stride `stride`), a kLanes x kLanes square at a time
// through registers: for each column j and each full block of kLanes rows from i0, put(j, i0, x) with x lane l =
// src[(i0 + l) * stride + j]; the elements outside the full squares one at a time, put_one(j, i, src[i][j]).
template <class Vt, class Put, class PutOne>
KDA_INLINE void TransposeCopy(const float* src, size_t stride, int rows, int cols, Put&& put, PutOne&& put_one) {
  constexpr int kL = Vt::kLanes;
  const int full_rows = rows - rows % kL;
  const int full_cols = cols - cols % kL;
  for (int i0 = 0; i0 < full_rows; i0 += kL) {
    for (int j0 = 0; j0 < full_cols; j0 += kL) {
      typename Vt::Reg t[kL];
      for (int l = 0; l < kL; ++l) t[l] = Vt::Load(src + static_cast<size_t>(i0 + l) * stride + j0);
      Vt::Transpose(t);
      for (int l = 0; l < kL; ++l) put(j0 + l, i0, t[l]);
    }
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = i < full_rows ? full_cols : 0; j < cols; ++j) put_one(j, i, src[static_cast<size_t>(i) * stride + j]);
  }
}

// Whether StreamOut<Vec> stores lanes [offset, offset + lanes) of buf with a
// non-temporal store: the target has them and the destination is aligned for
// one (a register's bytes in fp32, half of them in bf16 and f16).
KDA_INLINE bool Streams(const MutBuf& buf, size_t offset) {
#if KDA_HAS_STREAM_STORES
  const size_t bytes = DTypeSize(buf.dtype);
  const auto at = reinterpret_cast<uintptr_t>(static_cast<const char*>(buf.data) + offset * bytes);
  return at % (sizeof(Vec::Reg) * bytes / sizeof(float)) == 0;
#else
  static_cast<void>(buf);
  static_cast<void>(offset);
  return false;
#endif
}

// StoreOut with a non-temporal store where Streams says so.
template <class Vt>
KDA_INLINE void StreamOut(const MutBuf& buf, size_t offset, typename Vt::Reg x) {
#if KDA_HAS_STREAM_STORES
  if constexpr (std::is_same_v<Vt, Vec>) {  // (a HalfVec register: plain stores)
    if (Streams(buf, offset)) {
      if (buf.dtype == DType::kF32) {
        VecStream::Store(static_cast<float*>(buf.data) + offset, x);
      } else if (buf.dtype == DType::kBF16) {
        VecStream::StoreBF16(static_cast<BF16*>(buf.data) + offset, x);
      } else {
        VecStream::StoreF16(static_cast<F16*>(buf.data) + offset, x);
      }
      return;
    }
  }
#endif
  StoreOut<Vt>(buf, offset, x);
}

// The factor of the in-kernel L2 norm of x[0, len), x / sqrt(sum x^2 + eps),
// applied as one multiplication (within an ulp of the reference's division);
// len is a multiple of the lanes.
template <class Vt>
KDA_INLINE float InverseNorm(const float* x, int len) {
  typename Vt::Reg acc = Vt::Zero();
  for (int d = 0; d < len; d += Vt::kLanes) {
    const typename Vt::Reg v = Vt::Load(x + d);
    acc = Vt::Fma(v, v, acc);
  }
  return 1.0F / __builtin_sqrtf(Vt::ReduceAdd(acc) + kc::kL2NormEps);
}

// The in-kernel gate of one row of value head h (see KdaOptions): this
// target's gate kernel, or fla's sigmoid gate with a lower bound.
KDA_INLINE void ActivateGate(const KdaOptions& opt, int h, int len, float* g) {
  const float* bias =
      opt.dt_bias != nullptr ? opt.dt_bias + static_cast<size_t>(h) * static_cast<size_t>(len) : nullptr;
  if (!opt.use_lower_bound) {
    GateRow(g, bias, -__builtin_expf(opt.A_log[h]), len);
    return;
  }
  LowerBoundGateRow(g, bias, opt.A_log != nullptr ? __builtin_expf(opt.A_log[h]) : 1.0F, opt.lower_bound, len);
}

// beta as the kernels use it: as stored, or beta_scale * sigmoid(logit).
KDA_INLINE float ActivateBeta(const KdaOptions& opt, float x) {
  return opt.use_beta_sigmoid_in_kernel ? opt.beta_scale * Sigmoid<Scalar>(x) : x;
}

}  // namespace
}  // namespace kda::KDA_TARGET_NS
