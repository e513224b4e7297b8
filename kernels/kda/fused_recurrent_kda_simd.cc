// The optimized fused_recurrent_kda (decode) compute code, compiled once per
// instruction set (kernels/isa/target.h). Host side: kernels/kda/kda_optimized.cc; plain
// reference: fused_recurrent_kda_reference.cc.
//
// Decode (fused_recurrent_kda) is memory-bound: per (sequence, head) one pass
// reads the state for the projection and a second pass (hitting L2) applies
// decay, update and readout and writes it back.
#include <cstddef>
#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"
#include "kernels/kda/kda_tasks.h"
#include "kernels/kda/kda_vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// ------------------------------------------------------------------- decode

// Columns [col, col + NV*lanes) of one decode step on state s ([K][V], in place):
//   p = sum_d (k_d e^{g_d}) S[d,:];  delta = beta (v - p)
//   S[d,:] = e^{g_d} S[d,:] + k_d delta;  o = sum_d q_d S[d,:]
template <class Vt, int NV>
void DecodeColumns(float* s, int kd, int vd, int col, const float* q, const float* k, const float* e, const float* ke,
                   const float* v, float beta, const MutBuf& out, size_t out_off) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  Reg p[NV];
  Reg o[NV];
  Reg delta[NV];
  for (int j = 0; j < NV; ++j) p[j] = Vt::Zero();
  for (int d = 0; d < kd; ++d) {
    const Reg kv = Vt::Set1(ke[d]);
    const float* sd = s + static_cast<size_t>(d) * vd + col;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) p[j] = Vt::Fma(kv, Vt::Load(sd + j * kL), p[j]);
  }
  const Reg b = Vt::Set1(beta);
  for (int j = 0; j < NV; ++j) {
    delta[j] = Vt::Mul(b, Vt::Sub(Vt::Load(v + col + j * kL), p[j]));
    o[j] = Vt::Zero();
  }
  for (int d = 0; d < kd; ++d) {
    const Reg ed = Vt::Set1(e[d]);
    const Reg kv = Vt::Set1(k[d]);
    const Reg qv = Vt::Set1(q[d]);
    float* sd = s + static_cast<size_t>(d) * vd + col;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const Reg x = Vt::Fma(kv, delta[j], Vt::Mul(Vt::Load(sd + j * kL), ed));
      o[j] = Vt::Fma(qv, x, o[j]);
      Vt::Store(sd + j * kL, x);
    }
  }
  for (int j = 0; j < NV; ++j) StoreOut<Vt>(out, out_off + col + static_cast<size_t>(j) * kL, o[j]);
}

// One decode task (entry n, head h); column blocks of up to NV registers.
template <class Vt, int NV>
void RunRecurrentTask(const internal::RecurrentTask& task) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  const RecurrentKdaArgs& a = *task.args;
  const int kd = a.K;
  const int vd = a.V;
  const size_t row = static_cast<size_t>(task.n) * static_cast<size_t>(a.H) + static_cast<size_t>(task.h);
  const size_t out_off = row * static_cast<size_t>(vd);
  const int32_t idx = a.state_indices[task.n];
  if (idx < 0) {  // padding: zero output, no state touched
    for (int j = 0; j < vd; j += kL) StoreOut<Vt>(a.o, out_off + j, Vt::Zero());
    return;
  }
  alignas(64) float q[kc::kMaxHeadDim];
  alignas(64) float k[kc::kMaxHeadDim];
  alignas(64) float e[kc::kMaxHeadDim];
  alignas(64) float ke[kc::kMaxHeadDim];
  alignas(64) float v[kc::kMaxHeadDim];
  const size_t base = row * static_cast<size_t>(kd);
  LoadRow<Vt>(a.g, base, kd, e);
  LoadRow<Vt>(a.v, row * vd, vd, v);
  if (a.options.use_gate_in_kernel) ActivateGate(a.options, task.h, kd, e);
  float q_mul = task.scale;
  float k_mul = 1.0F;
  if (a.options.use_qk_l2norm_in_kernel) {
    q_mul *= InverseNorm<Vt>(a.q, base, kd);
    k_mul = InverseNorm<Vt>(a.k, base, kd);
  }
  const Reg q_scale = Vt::Set1(q_mul);
  const Reg k_scale = Vt::Set1(k_mul);
  for (int d = 0; d < kd; d += kL) {
    const Reg decay = Exp<Vt>(Vt::Load(e + d));
    const Reg kv = Vt::Mul(LoadAt<Vt>(a.k, base + d), k_scale);
    Vt::Store(e + d, decay);
    Vt::Store(k + d, kv);
    Vt::Store(ke + d, Vt::Mul(kv, decay));
    Vt::Store(q + d, Vt::Mul(LoadAt<Vt>(a.q, base + d), q_scale));
  }
  const float beta = LoadScalar(a.beta, row);
  float* s = a.state + (static_cast<size_t>(idx) * static_cast<size_t>(a.H) + static_cast<size_t>(task.h)) *
                           static_cast<size_t>(kd) * static_cast<size_t>(vd);
  int col = 0;
  for (; col + NV * kL <= vd; col += NV * kL) DecodeColumns<Vt, NV>(s, kd, vd, col, q, k, e, ke, v, beta, a.o, out_off);
  for (; col < vd; col += kL) DecodeColumns<Vt, 1>(s, kd, vd, col, q, k, e, ke, v, beta, a.o, out_off);
}

}  // namespace

void FusedRecurrentKdaTask(const internal::RecurrentTask& task) { RunRecurrentTask<Vec, kDecodeRegs>(task); }

}  // namespace kda::KDA_TARGET_NS
