// Loads and stores of the optimized KDA kernels' F32 or BF16 buffers, shared
// by chunk_kda_simd.cc and fused_recurrent_kda_simd.cc (per-ISA sources; see
// kernels/isa/target.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// Element i of an F32 or BF16 buffer.
KDA_INLINE float LoadScalar(const ConstBuf& buf, size_t i) {
  return buf.dtype == DType::kBF16 ? LoadBF16<Scalar>(static_cast<const BF16*>(buf.data) + i)
                                   : static_cast<const float*>(buf.data)[i];
}

// Lanes [i, i + lanes) of an F32 or BF16 buffer as fp32.
template <class Vt>
KDA_INLINE typename Vt::Reg LoadAt(const ConstBuf& buf, size_t i) {
  return buf.dtype == DType::kBF16 ? LoadBF16<Vt>(static_cast<const BF16*>(buf.data) + i)
                                   : Vt::Load(static_cast<const float*>(buf.data) + i);
}

// out[0, len) = buf[offset, offset + len) as fp32; len is a multiple of the lanes.
template <class Vt>
KDA_INLINE void LoadRow(const ConstBuf& buf, size_t offset, int len, float* out) {
  for (int d = 0; d < len; d += Vt::kLanes) Vt::Store(out + d, LoadAt<Vt>(buf, offset + d));
}

// buf[offset + j] = x[j] for the lanes of one register (F32 or BF16 output).
template <class Vt>
KDA_INLINE void StoreOut(const MutBuf& buf, size_t offset, typename Vt::Reg x) {
  if (buf.dtype == DType::kBF16) {
    StoreBF16<Vt>(static_cast<BF16*>(buf.data) + offset, x);
  } else {
    Vt::Store(static_cast<float*>(buf.data) + offset, x);
  }
}

// StoreOut with a non-temporal store where the target has them and the
// destination is aligned for it.
template <class Vt>
KDA_INLINE void StreamOut(const MutBuf& buf, size_t offset, typename Vt::Reg x) {
#if KDA_HAS_STREAM_STORES
  if (buf.dtype == DType::kF32) {
    float* p = static_cast<float*>(buf.data) + offset;
    if (reinterpret_cast<uintptr_t>(p) % sizeof(typename Vt::Reg) == 0) {
      VecStream::Store(p, x);
      return;
    }
  } else {
    BF16* p = static_cast<BF16*>(buf.data) + offset;
    if (reinterpret_cast<uintptr_t>(p) % (sizeof(typename Vt::Reg) / 2) == 0) {
      VecStream::StoreBF16(p, x);
      return;
    }
  }
#endif
  StoreOut<Vt>(buf, offset, x);
}

// sum_d x[offset + d]^2 over d < len of an F32 or BF16 buffer.
template <class Vt>
KDA_INLINE float SumSquares(const ConstBuf& buf, size_t offset, int len) {
  typename Vt::Reg acc = Vt::Zero();
  for (int d = 0; d < len; d += Vt::kLanes) {
    const typename Vt::Reg v = LoadAt<Vt>(buf, offset + d);
    acc = Vt::Fma(v, v, acc);
  }
  return Vt::ReduceAdd(acc);
}

// The factor of the in-kernel L2 norm, x / sqrt(sum x^2 + eps), applied as one
// multiplication (within an ulp of the reference's division).
template <class Vt>
KDA_INLINE float InverseNorm(const ConstBuf& buf, size_t offset, int len) {
  return 1.0F / __builtin_sqrtf(SumSquares<Vt>(buf, offset, len) + kc::kL2NormEps);
}

// The in-kernel gate of one row (this target's gate kernel).
KDA_INLINE void ActivateGate(const KdaOptions& opt, int h, int len, float* g) {
  const float* bias =
      opt.dt_bias != nullptr ? opt.dt_bias + static_cast<size_t>(h) * static_cast<size_t>(len) : nullptr;
  GateRow(g, bias, -__builtin_expf(opt.A_log[h]), len);
}

KDA_INLINE size_t ElementBytes(DType t) { return t == DType::kBF16 ? 2 : 4; }

}  // namespace
}  // namespace kda::KDA_TARGET_NS
