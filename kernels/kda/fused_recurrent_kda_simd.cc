// The optimized fused_recurrent_kda (decode) compute code, compiled once per
// instruction set (kernels/isa/target.h). Host side: kernels/kda/kda_optimized.cc; plain
// reference: fused_recurrent_kda_reference.cc.
//
// Decode (fused_recurrent_kda) is memory-bound: per (sequence, value head)
// and token one pass reads the state for the projection and a second pass
// (hitting L2) applies decay, update and readout and writes it where the
// token's state goes.
#include <cstddef>
#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"
#include "kernels/kda/kda_states.h"
#include "kernels/kda/kda_tasks.h"
#include "kernels/kda/kda_vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// ------------------------------------------------------------------- decode

// Columns [col, col + NV*lanes) of one token's step from state `in` to state
// `out` ([K][V] each, row stride vd; in may be out):
//   p = sum_d (k_d e^{g_d}) S[d,:];  delta = beta (v - p)
//   S'[d,:] = e^{g_d} S[d,:] + k_d delta;  o = sum_d q_d S'[d,:]
template <class Vt, int NV>
void DecodeColumns(const float* in, float* out, int kd, int vd, int col, const float* q, const float* k, const float* e,
                   const float* ke, const float* v, const float* beta, const MutBuf& o_buf, size_t out_off) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  Reg p[NV];
  Reg o[NV];
  Reg delta[NV];
  for (int j = 0; j < NV; ++j) p[j] = Vt::Zero();
  for (int d = 0; d < kd; ++d) {
    const Reg kv = Vt::Set1(ke[d]);
    const float* sd = in + static_cast<size_t>(d) * vd + col;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) p[j] = Vt::Fma(kv, Vt::Load(sd + j * kL), p[j]);
  }
  for (int j = 0; j < NV; ++j) {
    delta[j] = Vt::Mul(Vt::Load(beta + col + j * kL), Vt::Sub(Vt::Load(v + col + j * kL), p[j]));
    o[j] = Vt::Zero();
  }
  for (int d = 0; d < kd; ++d) {
    const Reg ed = Vt::Set1(e[d]);
    const Reg kv = Vt::Set1(k[d]);
    const Reg qv = Vt::Set1(q[d]);
    const float* sd = in + static_cast<size_t>(d) * vd + col;
    float* od = out + static_cast<size_t>(d) * vd + col;
    // The row's registers are loaded before any is stored: in and out may be one buffer, and loads
    // interleaved with stores to a possibly aliasing pointer could not be issued ahead.
    Reg x[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) x[j] = Vt::Load(sd + j * kL);
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      x[j] = Vt::Fma(kv, delta[j], Vt::Mul(x[j], ed));
      o[j] = Vt::Fma(qv, x[j], o[j]);
      Vt::Store(od + j * kL, x[j]);
    }
  }
  for (int j = 0; j < NV; ++j) StoreOut<Vt>(o_buf, out_off + col + static_cast<size_t>(j) * kL, o[j]);
}

// One token's step over all V columns: blocks of NV registers, then single
// registers, then single columns (V not a multiple of the lanes).
template <class Vt, int NV>
void DecodeStep(const float* in, float* out, int kd, int vd, const float* q, const float* k, const float* e,
                const float* ke, const float* v, const float* beta, const MutBuf& o_buf, size_t out_off) {
  constexpr int kL = Vt::kLanes;
  int col = 0;
  for (; col + NV * kL <= vd; col += NV * kL) {
    DecodeColumns<Vt, NV>(in, out, kd, vd, col, q, k, e, ke, v, beta, o_buf, out_off);
  }
  for (; col + kL <= vd; col += kL) DecodeColumns<Vt, 1>(in, out, kd, vd, col, q, k, e, ke, v, beta, o_buf, out_off);
  for (; col < vd; ++col) DecodeColumns<Scalar, 1>(in, out, kd, vd, col, q, k, e, ke, v, beta, o_buf, out_off);
}

// A head's state between its stored layout (K-major, or V-first [V][K]) and a [K][V] working copy; src null:
// zeros.
KDA_INLINE void LoadWorking(const float* src, int kd, int vd, bool v_first, float* work) {
  const size_t n = static_cast<size_t>(kd) * static_cast<size_t>(vd);
  if (src == nullptr) {
    for (size_t i = 0; i < n; ++i) work[i] = 0.0F;
  } else if (!v_first) {
    for (size_t i = 0; i < n; ++i) work[i] = src[i];
  } else {
    for (int j = 0; j < vd; ++j) {
      for (int d = 0; d < kd; ++d) work[static_cast<size_t>(d) * vd + j] = src[static_cast<size_t>(j) * kd + d];
    }
  }
}
KDA_INLINE void StoreWorking(const float* work, int kd, int vd, bool v_first, float* dst) {
  const size_t n = static_cast<size_t>(kd) * static_cast<size_t>(vd);
  if (!v_first) {
    for (size_t i = 0; i < n; ++i) dst[i] = work[i];
  } else {
    for (int j = 0; j < vd; ++j) {
      for (int d = 0; d < kd; ++d) dst[static_cast<size_t>(j) * kd + d] = work[static_cast<size_t>(d) * vd + j];
    }
  }
}

// One task (sequence n, value head h); column blocks of up to NV registers.
// K-major states are stepped from where they are to where the token's state
// goes (in place in a pool slot for plain decode), through the worker's
// scratch for tokens whose state is not written; V-first states are stepped
// in the scratch and copied out where written.
template <class Vt, int NV>
void RunRecurrentTask(const internal::RecurrentTask& task) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  const RecurrentKdaArgs& a = *task.args;
  const int kd = a.K;
  const int vd = a.V;
  const int kp = internal::RoundUpTo(kd, kL);
  const int vp = internal::PaddedValueDim(vd, kL);
  const int64_t bos = a.cu_seqlens[task.n];
  const int64_t eos = a.cu_seqlens[task.n + 1];
  const internal::RecurrentStates st = internal::RecurrentStatesOf(a, task.n);
  if (st.padding) {  // zero outputs, no state touched
    for (int64_t t = bos; t < eos; ++t) {
      const size_t off = static_cast<size_t>(t * a.HV + task.h) * static_cast<size_t>(vd);
      for (int j = 0; j < vd; ++j) StoreScalar(a.o, off + j, 0.0F);
    }
    return;
  }
  const size_t head_off = static_cast<size_t>(task.h) * static_cast<size_t>(kd) * static_cast<size_t>(vd);
  const float* cur = st.initial != nullptr ? st.initial + head_off : nullptr;
  float* scratch = task.scratch;
  if (a.state_v_first) {
    LoadWorking(cur, kd, vd, true, scratch);
    cur = scratch;
  }
  if (bos == eos) {  // an empty sequence's final state is its initial state (contiguous form)
    float* empty_final = internal::EmptySequenceFinalState(a, task.n);
    if (empty_final != nullptr && empty_final != st.initial) {
      if (a.state_v_first) {
        StoreWorking(scratch, kd, vd, true, empty_final + head_off);
      } else {
        LoadWorking(cur, kd, vd, false, empty_final + head_off);
      }
    }
    return;
  }
  alignas(64) float q[kc::kMaxHeadDim];
  alignas(64) float k[kc::kMaxHeadDim];
  alignas(64) float e[kc::kMaxHeadDim];
  alignas(64) float ke[kc::kMaxHeadDim];
  alignas(64) float v[kc::kMaxHeadDim];
  alignas(64) float beta[kc::kMaxHeadDim];
  const int kh = internal::KeyHeadOf(task.h, a.H, a.HV);
  for (int64_t t = bos; t < eos; ++t) {
    const size_t value_row = static_cast<size_t>(t * a.HV + task.h);
    LoadRowPadded<Vt>(a.q, internal::QOffset(a, t, kh), kd, kp, q);
    LoadRowPadded<Vt>(a.k, internal::KOffset(a, t, kh), kd, kp, k);
    LoadRowPadded<Vt>(a.g, value_row * kd, kd, kp, e);
    LoadRowPadded<Vt>(a.v, internal::VOffset(a, t, task.h), vd, vp, v);
    if (a.beta_per_value) {
      LoadRowPadded<Vt>(a.beta, value_row * vd, vd, vp, beta);
      for (int j = 0; j < vd; ++j) beta[j] = ActivateBeta(a.options, beta[j]);
    } else {
      const float b = ActivateBeta(a.options, LoadScalar(a.beta, value_row));
      for (int j = 0; j < vp; ++j) beta[j] = b;
    }
    if (a.options.use_gate_in_kernel) {
      ActivateGate(a.options, task.h, kd, e);
      for (int d = kd; d < kp; ++d) e[d] = 0.0F;
    }
    float q_mul = task.scale;
    float k_mul = 1.0F;
    if (a.options.use_qk_l2norm_in_kernel) {
      q_mul *= InverseNorm<Vt>(q, kp);
      k_mul = InverseNorm<Vt>(k, kp);
    }
    const Reg q_scale = Vt::Set1(q_mul);
    const Reg k_scale = Vt::Set1(k_mul);
    for (int d = 0; d < kp; d += kL) {
      const Reg decay = Exp<Vt>(Vt::Load(e + d));
      const Reg kv = Vt::Mul(Vt::Load(k + d), k_scale);
      Vt::Store(e + d, decay);
      Vt::Store(k + d, kv);
      Vt::Store(ke + d, Vt::Mul(kv, decay));
      Vt::Store(q + d, Vt::Mul(Vt::Load(q + d), q_scale));
    }
    float* dst = internal::TokenStateDestination(a, task.n, t - bos, eos - bos);
    if (dst != nullptr) dst += head_off;
    float* out = a.state_v_first || dst == nullptr ? scratch : dst;
    if (cur == nullptr) {  // zeros: the step reads the zeroed destination
      LoadWorking(nullptr, kd, vd, false, out);
      cur = out;
    }
    DecodeStep<Vt, NV>(cur, out, kd, vd, q, k, e, ke, v, beta, a.o, value_row * static_cast<size_t>(vd));
    if (a.state_v_first && dst != nullptr) StoreWorking(scratch, kd, vd, true, dst);
    cur = out;
  }
}

}  // namespace

void FusedRecurrentKdaTask(const internal::RecurrentTask& task) { RunRecurrentTask<Vec, kDecodeRegs>(task); }

}  // namespace kda::KDA_TARGET_NS
