// The optimized fused_recurrent_kda (decode) compute code, compiled once per
// instruction set (kernels/isa/target.h). Host side: kernels/kda/kda_optimized.cc; plain
// reference: fused_recurrent_kda_reference.cc.
//
// Decode (fused_recurrent_kda) is memory-bound: per (sequence, value head)
// and token one pass reads the state for the projection and a second pass
// (hitting L2) applies decay, update and readout and writes it where the
// token's state goes. Sequences of several tokens whose intermediate states
// go nowhere (verify steps, their commits, fla's multi-token calls) take
// their tokens kShortTokens at a time in chunk form instead (ShortChunk):
// one read pass and at most one write pass over the state per chunk.
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

// One token's prepared rows (PrepareToken), zero-padded: q (scaled), k, e =
// e^g (row d at e[d * e_step]: e_step 0 for a scalar gate, whose one decay
// serves every row), ke = k e, v, beta.
struct TokenRows {
  const float* q;
  const float* k;
  const float* e;
  int e_step;
  const float* ke;
  const float* v;
  const float* beta;
  bool delta_correction;  // false: p = 0 (no projection pass), delta = beta v
  const float* skip;      // the head's D (Mamba2's o + D v), or null
};

// Columns [col, col + NV*lanes) of one token's step from state `in` to state
// `out` ([K][V] each, row stride vd; in may be out):
//   p = sum_d (k_d e^{g_d}) S[d,:];  delta = beta (v - p)   (without the delta correction p = 0)
//   S'[d,:] = e^{g_d} S[d,:] + k_d delta;  o = sum_d q_d S'[d,:]
template <class Vt, int NV>
void DecodeColumns(const float* in, float* out, int kd, int vd, int col, const TokenRows& r, const MutBuf& o_buf,
                   size_t out_off) {
  const float* q = r.q;
  const float* k = r.k;
  const float* ke = r.ke;
  const float* v = r.v;
  const float* beta = r.beta;
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  Reg p[NV];
  Reg o[NV];
  Reg delta[NV];
  for (int j = 0; j < NV; ++j) p[j] = Vt::Zero();
  for (int d = 0; d < kd && r.delta_correction; ++d) {
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
    const Reg ed = Vt::Set1(r.e[d * r.e_step]);
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
  for (int j = 0; j < NV && r.skip != nullptr; ++j) o[j] = Vt::Fma(Vt::Set1(*r.skip), Vt::Load(v + col + j * kL), o[j]);
  for (int j = 0; j < NV; ++j) StoreOut<Vt>(o_buf, out_off + col + static_cast<size_t>(j) * kL, o[j]);
}

// One token's step over all V columns: blocks of NV registers, then single
// registers, then single columns (V not a multiple of the lanes).
template <class Vt, int NV>
void DecodeStep(const float* in, float* out, int kd, int vd, const TokenRows& r, const MutBuf& o_buf, size_t out_off) {
  constexpr int kL = Vt::kLanes;
  int col = 0;
  for (; col + NV * kL <= vd; col += NV * kL) DecodeColumns<Vt, NV>(in, out, kd, vd, col, r, o_buf, out_off);
  for (; col + kL <= vd; col += kL) DecodeColumns<Vt, 1>(in, out, kd, vd, col, r, o_buf, out_off);
  for (; col < vd; ++col) DecodeColumns<Scalar, 1>(in, out, kd, vd, col, r, o_buf, out_off);
}

// One token's step of a V-first state ([V][K]: row j is column j of S) from `in` (null: zeros) to `out` (in may
// be out), row by row where the state is stored (no transposed working copy): per column j
//   p_j = sum_d (k_d e^{g_d}) S[d,j];  delta_j = beta_j (v_j - p_j)   (without the delta correction p_j = 0)
//   S'[d,j] = e^{g_d} S[d,j] + k_d delta_j;  o_j = sum_d q_d S'[d,j]
// each state element by the same operations as DecodeColumns (the sums p and o in another order). A row is read
// from memory once: the projection's pass brings it into L1 for the update's.
template <class Vt>
void DecodeStepVFirst(const float* in, float* out, int kd, int vd, const TokenRows& r, const MutBuf& o_buf,
                      size_t out_off) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  const int kv = kd - kd % kL;  // the rows' elements in whole registers; the rest one by one
  const bool scalar_gate = r.e_step == 0;
  for (int j = 0; j < vd; ++j) {
    const float* sj = in != nullptr ? in + static_cast<size_t>(j) * kd : nullptr;
    float* oj = out + static_cast<size_t>(j) * kd;
    float p = 0.0F;
    if (r.delta_correction && sj != nullptr) {
      Reg acc = Vt::Zero();
      for (int d = 0; d < kv; d += kL) acc = Vt::Fma(Vt::Load(r.ke + d), Vt::Load(sj + d), acc);
      p = Vt::ReduceAdd(acc);
      for (int d = kv; d < kd; ++d) p = Scalar::Fma(r.ke[d], sj[d], p);
    }
    const float delta = r.beta[j] * (r.v[j] - p);
    const Reg dv = Vt::Set1(delta);
    Reg acc = Vt::Zero();
    for (int d = 0; d < kv; d += kL) {
      const Reg x = sj != nullptr ? Vt::Load(sj + d) : Vt::Zero();
      const Reg y = Vt::Fma(Vt::Load(r.k + d), dv, Vt::Mul(x, scalar_gate ? Vt::Set1(r.e[0]) : Vt::Load(r.e + d)));
      acc = Vt::Fma(Vt::Load(r.q + d), y, acc);
      Vt::Store(oj + d, y);
    }
    float o = Vt::ReduceAdd(acc);
    for (int d = kv; d < kd; ++d) {
      const float x = sj != nullptr ? sj[d] : 0.0F;
      const float y = Scalar::Fma(r.k[d], delta, x * r.e[d * r.e_step]);
      o = Scalar::Fma(r.q[d], y, o);
      oj[d] = y;
    }
    if (r.skip != nullptr) o = Scalar::Fma(*r.skip, r.v[j], o);
    StoreScalar(o_buf, out_off + static_cast<size_t>(j), o);
  }
}

// dst = src, a head's state of rows x cols ([rows][cols]), or with `transpose` its transpose ([cols][rows]);
// src null: zeros. A state between its stored layout (K-major, or V-first [V][K]) and a [K][V] working copy:
// loaded CopyState(src, vd, kd, v_first, work), stored CopyState(work, kd, vd, v_first, dst).
template <class Vt>
KDA_INLINE void CopyState(const float* src, int rows, int cols, bool transpose, float* dst) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (src == nullptr) {
    for (size_t i = 0; i < n; ++i) dst[i] = 0.0F;
  } else if (!transpose) {
    for (size_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    TransposeCopy<Vt>(
        src, static_cast<size_t>(cols), rows, cols,
        [&](int c, int r0, typename Vt::Reg x) { Vt::Store(dst + static_cast<size_t>(c) * rows + r0, x); },
        [&](int c, int r, float x) { dst[static_cast<size_t>(c) * rows + r] = x; });
  }
}

// ----------------------------------------------------- short chunks

constexpr size_t kCacheLine = 64;
constexpr int kPrefetchL2 = 2;  // __builtin_prefetch locality: prefetcht1

// Tokens a chunk-form step takes at once.
constexpr int kShortTokens = 8;
// Tokens whose projections one read pass accumulates in registers (two
// accumulators each): all of a chunk with 32 registers, half with 16.
constexpr int kProjectGroup = kVecRegisters >= 32 ? 8 : 4;

// A chunk's prepared token rows ([kShortTokens][kMaxHeadDim], zero-padded
// past K and V): q (scaled), k, e = e^g (a scalar gate: e[t][0] alone), v,
// beta; and the vectors the state passes read and write.
struct ShortRows {
  bool scalar_gate = false;
  bool delta_correction = true;  // false: delta_t = beta_t v_t
  const float* skip = nullptr;   // the head's D (Mamba2's o + D v), or null
  alignas(64) float q[kShortTokens][kc::kMaxHeadDim];
  alignas(64) float k[kShortTokens][kc::kMaxHeadDim];
  alignas(64) float e[kShortTokens][kc::kMaxHeadDim];
  alignas(64) float v[kShortTokens][kc::kMaxHeadDim];
  alignas(64) float beta[kShortTokens][kc::kMaxHeadDim];
  alignas(64) float kc[kShortTokens][kc::kMaxHeadDim];  // c_t k_t; then E_{t,L} k_t (the write pass's keys)
  alignas(64) float qc[kShortTokens][kc::kMaxHeadDim];  // c_t q_t
  alignas(64) float p[kShortTokens][kc::kMaxHeadDim];   // (c_t k_t)^T S0; then delta_t
  alignas(64) float o[kShortTokens][kc::kMaxHeadDim];   // (c_t q_t)^T S0; then o_t
  alignas(64) float c[kc::kMaxHeadDim];                 // c_L (a scalar gate: c[0] alone)
};

// Columns [col, col + lanes) of the projections of G tokens on state rows
// s ([kd][vd]): p[t] = sum_d kc[t][d] s[d,:], o[t] = sum_d qc[t][d] s[d,:].
// The pass walks the rows a column block at a time (a cache line per row);
// pf (or null) are kd lines to prefetch into L2, one per row.
template <class Vt, int G>
void ProjectColumns(const float* s, int kd, int vd, int col, const float (*kc)[kc::kMaxHeadDim],
                    const float (*qc)[kc::kMaxHeadDim], float (*p)[kc::kMaxHeadDim], float (*o)[kc::kMaxHeadDim],
                    const char* pf) {
  using Reg = typename Vt::Reg;
  Reg pa[G];
  Reg oa[G];
  for (int t = 0; t < G; ++t) pa[t] = oa[t] = Vt::Zero();
  for (int d = 0; d < kd; ++d) {
    if (pf != nullptr) __builtin_prefetch(pf + static_cast<size_t>(d) * kCacheLine, 0, kPrefetchL2);
    const Reg x = Vt::Load(s + static_cast<size_t>(d) * vd + col);
#pragma GCC unroll 8
    for (int t = 0; t < G; ++t) {
      pa[t] = Vt::Fma(Vt::Set1(kc[t][d]), x, pa[t]);
      oa[t] = Vt::Fma(Vt::Set1(qc[t][d]), x, oa[t]);
    }
  }
  for (int t = 0; t < G; ++t) {
    Vt::Store(p[t] + col, pa[t]);
    Vt::Store(o[t] + col, oa[t]);
  }
}

// The projections of tokens [t0, t0 + n) (n <= G), one pass over the
// state; the pass prefetches the state `next` (the next head's, [kd][vd],
// or null) into L2, a line per row and column block (as many as it holds).
template <class Vt, int G>
void ProjectState(const float* s, int kd, int vd, int vp, ShortRows& r, int t0, int n, const float* next) {
  if constexpr (G > 1) {
    if (n < G) {
      ProjectState<Vt, G - 1>(s, kd, vd, vp, r, t0, n, next);
      return;
    }
  }
  constexpr int kL = Vt::kLanes;
  const auto* pf = reinterpret_cast<const char*>(next);
  const size_t lines = static_cast<size_t>(kd) * vd * sizeof(float) / kCacheLine;
  int col = 0;
  for (; col + kL <= vd; col += kL) {
    const size_t first = static_cast<size_t>(col / kL) * kd;
    const char* block_pf = pf != nullptr && first + kd <= lines ? pf + first * kCacheLine : nullptr;
    ProjectColumns<Vt, G>(s, kd, vd, col, r.kc + t0, r.qc + t0, r.p + t0, r.o + t0, block_pf);
  }
  for (; col < vd; ++col) {
    ProjectColumns<Scalar, G>(s, kd, vd, col, r.kc + t0, r.qc + t0, r.p + t0, r.o + t0, nullptr);
  }
  for (int t = t0; t < t0 + G; ++t) {
    for (int j = vd; j < vp; ++j) r.p[t][j] = r.o[t][j] = 0.0F;  // padded columns: zeros, like v and beta
  }
}

// Columns [col, col + lanes) of the state after the chunk's L tokens:
// out[d,:] = c_L[d] s[d,:] + sum_t w_t[d] delta_t (s null: zeros; out may be s).
template <class Vt, int L>
void WriteColumns(const float* s, float* out, int kd, int vd, int col, const ShortRows& r) {
  using Reg = typename Vt::Reg;
  Reg delta[L];
  for (int t = 0; t < L; ++t) delta[t] = Vt::Load(r.p[t] + col);
  const int c_step = r.scalar_gate ? 0 : 1;
  for (int d = 0; d < kd; ++d) {
    const size_t at = static_cast<size_t>(d) * vd + col;
    Reg x = s != nullptr ? Vt::Mul(Vt::Load(s + at), Vt::Set1(r.c[d * c_step])) : Vt::Zero();
#pragma GCC unroll 8
    for (int t = 0; t < L; ++t) x = Vt::Fma(Vt::Set1(r.kc[t][d]), delta[t], x);
    Vt::Store(out + at, x);
  }
}

// The state after the chunk's n <= L tokens, column block by column block.
template <class Vt, int L>
void WriteState(int n, const float* s, float* out, int kd, int vd, const ShortRows& r) {
  if constexpr (L > 1) {
    if (n < L) {
      WriteState<Vt, L - 1>(n, s, out, kd, vd, r);
      return;
    }
  }
  constexpr int kL = Vt::kLanes;
  int col = 0;
  for (; col + kL <= vd; col += kL) WriteColumns<Vt, L>(s, out, kd, vd, col, r);
  for (; col < vd; ++col) WriteColumns<Scalar, L>(s, out, kd, vd, col, r);
}

// Dot product of two zero-padded rows of kp floats (kp a multiple of the lanes).
template <class Vt>
KDA_INLINE float Dot(const float* x, const float* y, int kp) {
  typename Vt::Reg acc = Vt::Zero();
  for (int d = 0; d < kp; d += Vt::kLanes) acc = Vt::Fma(Vt::Load(x + d), Vt::Load(y + d), acc);
  return Vt::ReduceAdd(acc);
}

// One chunk of L <= kShortTokens prepared tokens t = 1..L (rows r.q, r.k,
// r.e, r.v, r.beta; kp and vp multiples of Vt's lanes) from state s
// ([kd][vd]; null: zeros) in chunk form, with c_t = prod_{u<=t} e_u and
// E_{r,t} = prod_{r<u<=t} e_u (products, no divisions; with a scalar gate,
// scalars that multiply the plain dot products k_t . k_r and q_t . k_r):
//   p_t = (c_t k_t)^T S0 + sum_{r<t} A_tr delta_r,  A_tr = sum_d k_t[d] E_{r,t}[d] k_r[d]
//   delta_t = beta_t (v_t - p_t)   (without the delta correction: beta_t v_t)
//   o_t = (c_t q_t)^T S0 + sum_{r<=t} B_tr delta_r,  B_tr = sum_d q_t[d] E_{r,t}[d] k_r[d]
//   S_L = c_L S0 + sum_r (E_{r,L} k_r) delta_r^T
// the token-by-token recurrence (DecodeColumns) regrouped: one read pass
// over the state for all 2L projections (2L FMAs per element) and, where the
// state is written (out not null; out may be s), one write pass (L + 1),
// against 4L operations in 2L passes token by token. Outputs o_t go to
// o_buf at out_off + t * o_stride.
template <class Vt>
void ShortChunk(const float* s, float* out, int kd, int vd, int kp, int vp, int L, ShortRows& r, const MutBuf& o_buf,
                size_t out_off, size_t o_stride, const float* next) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  const bool scalar_gate = r.scalar_gate;
  for (int d = 0; d < kp; ++d) r.c[d] = 1.0F;
  for (int t = 0; t < L; ++t) {
    if (scalar_gate) r.c[0] *= r.e[t][0];
    for (int d = 0; d < kp; d += kL) {
      const Reg c = scalar_gate ? Vt::Set1(r.c[0]) : Vt::Mul(Vt::Load(r.c + d), Vt::Load(r.e[t] + d));
      if (!scalar_gate) Vt::Store(r.c + d, c);
      Vt::Store(r.kc[t] + d, Vt::Mul(c, Vt::Load(r.k[t] + d)));
      Vt::Store(r.qc[t] + d, Vt::Mul(c, Vt::Load(r.q[t] + d)));
    }
  }
  if (s != nullptr) {
    for (int t0 = 0; t0 < L; t0 += kProjectGroup) {
      ProjectState<Vt, kProjectGroup>(s, kd, vd, vp, r, t0, L - t0 < kProjectGroup ? L - t0 : kProjectGroup, next);
    }
  } else {
    for (int t = 0; t < L; ++t) {
      for (int j = 0; j < vp; ++j) r.p[t][j] = r.o[t][j] = 0.0F;
    }
  }
  // A and B; r.kc[t] becomes E_{t,L} k_t, the write pass's key of token t.
  float a_tr[kShortTokens][kShortTokens];
  float b_tr[kShortTokens][kShortTokens];
  for (int t = 0; t < L; ++t) {
    float* w = r.kc[t];
    b_tr[t][t] = Dot<Vt>(r.q[t], r.k[t], kp);
    if (scalar_gate) {  // E_{t,u} a scalar: the dot products times the mask
      float decay = 1.0F;
      for (int u = t + 1; u < L; ++u) {
        decay *= r.e[u][0];
        a_tr[u][t] = decay * Dot<Vt>(r.k[u], r.k[t], kp);
        b_tr[u][t] = decay * Dot<Vt>(r.q[u], r.k[t], kp);
      }
      const Reg e = Vt::Set1(decay);
      for (int d = 0; d < kp; d += kL) Vt::Store(w + d, Vt::Mul(e, Vt::Load(r.k[t] + d)));
      continue;
    }
    for (int d = 0; d < kp; ++d) w[d] = r.k[t][d];
    for (int u = t + 1; u < L; ++u) {
      for (int d = 0; d < kp; d += kL) Vt::Store(w + d, Vt::Mul(Vt::Load(w + d), Vt::Load(r.e[u] + d)));
      a_tr[u][t] = Dot<Vt>(r.k[u], w, kp);
      b_tr[u][t] = Dot<Vt>(r.q[u], w, kp);
    }
  }
  // delta_t in place of p_t, then o_t in place of (c_t q_t)^T S0.
  for (int t = 0; t < L; ++t) {
    float* delta = r.p[t];
    for (int j = 0; j < vp; j += kL) {
      Reg x = Vt::Load(r.v[t] + j);
      if (r.delta_correction) {
        x = Vt::Sub(x, Vt::Load(delta + j));
        for (int u = 0; u < t; ++u) x = Vt::Fnma(Vt::Set1(a_tr[t][u]), Vt::Load(r.p[u] + j), x);
      }
      Vt::Store(delta + j, Vt::Mul(Vt::Load(r.beta[t] + j), x));
    }
  }
  for (int t = 0; t < L; ++t) {
    const size_t off = out_off + static_cast<size_t>(t) * o_stride;
    for (int j = 0; j < vp; j += kL) {
      Reg x = Vt::Load(r.o[t] + j);
      for (int u = 0; u <= t; ++u) x = Vt::Fma(Vt::Set1(b_tr[t][u]), Vt::Load(r.p[u] + j), x);
      if (r.skip != nullptr) x = Vt::Fma(Vt::Set1(*r.skip), Vt::Load(r.v[t] + j), x);
      if (j + kL <= vd) {
        StoreOut<Vt>(o_buf, off + j, x);
      } else {
        StoreOutPart<Vt>(o_buf, off + j, x, vd - j);
      }
    }
  }
  if (out != nullptr) WriteState<Vt, kShortTokens>(L, s, out, kd, vd, r);
}

// ------------------------------------------------------------ tasks

// Token t's rows of value head h (key head kh) for the step, zero-padded to
// kp / vp: q (times the scale and, with the in-kernel L2 norm, its inverse
// norm), k (normalised likewise), e = e^g (after the in-kernel gate; a scalar
// gate: e[0] alone), ke = k e (null: not wanted; the chunk form does without
// it), v and beta (activated; per value dim or broadcast).
template <class Vt>
KDA_INLINE void PrepareToken(const internal::RecurrentTask& task, int64_t t, int kh, int kp, int vp, float* q, float* k,
                             float* e, float* ke, float* v, float* beta) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  const RecurrentKdaArgs& a = *task.args;
  const int kd = a.K;
  const int vd = a.V;
  const bool scalar_gate = a.scalar_gate;
  const size_t value_row = static_cast<size_t>(t * a.HV + task.h);
  LoadRowPadded<Vt>(a.q, internal::QOffset(a, t, kh), kd, kp, q);
  LoadRowPadded<Vt>(a.k, internal::KOffset(a, t, kh), kd, kp, k);
  Reg scalar_decay = Vt::Zero();
  if (scalar_gate) {
    float g = LoadScalar(a.g, value_row);
    if (a.options.use_gate_in_kernel) ActivateGate(a.options, task.h, 1, &g);
    scalar_decay = Exp<Vt>(Vt::Set1(g));
    alignas(64) float lanes[kL];
    Vt::Store(lanes, scalar_decay);
    e[0] = lanes[0];
  } else {
    LoadRowPadded<Vt>(a.g, value_row * kd, kd, kp, e);
  }
  LoadRowPadded<Vt>(a.v, internal::VOffset(a, t, task.h), vd, vp, v);
  if (a.beta_per_value) {
    LoadRowPadded<Vt>(a.beta, value_row * vd, vd, vp, beta);
    for (int j = 0; j < vd; ++j) beta[j] = ActivateBeta(a.options, beta[j]);
  } else {
    const float b = ActivateBeta(a.options, LoadScalar(a.beta, value_row));
    for (int j = 0; j < vp; ++j) beta[j] = b;
  }
  if (a.options.use_gate_in_kernel && !scalar_gate) {
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
    const Reg decay = scalar_gate ? scalar_decay : Exp<Vt>(Vt::Load(e + d));
    const Reg kv = Vt::Mul(Vt::Load(k + d), k_scale);
    if (!scalar_gate) Vt::Store(e + d, decay);
    Vt::Store(k + d, kv);
    if (ke != nullptr) Vt::Store(ke + d, Vt::Mul(kv, decay));
    Vt::Store(q + d, Vt::Mul(Vt::Load(q + d), q_scale));
  }
}

// Whether sequence n (len >= 2 tokens) writes no state before its last token.
KDA_INLINE bool OnlyFinalStateWritten(const RecurrentKdaArgs& a, int64_t n, int64_t len) {
  for (int64_t t = 0; t + 1 < len; ++t) {
    if (internal::TokenStateDestination(a, n, t, len) != nullptr) return false;
  }
  return true;
}

// A task's head dims (K, V; padded to the lanes), its sequence's token range
// [bos, eos) and the offset of its head's [K][V] state in a sequence's.
struct TaskDims {
  int kd, vd, kp, vp;
  int64_t bos, eos;
  size_t head_off;
};

// Sequence task.n's tokens for value head task.h (dims: the task's, as RunRecurrentTask found them), kShortTokens
// at a time through ShortChunk, from `cur` (its state or the V-first working copy in the scratch; null: zeros);
// `initial` is the sequence's stored [HV, K, V] initial states (or null). Kept out of RunRecurrentTask so that the
// chunk rows (about 75 KB of stack at the largest head dims) are no part of a single-token step's frame.
template <class Vt>
[[gnu::noinline]] void RunShortChunks(const internal::RecurrentTask& task, const TaskDims& dims, const float* initial,
                                      const float* cur) {
  const RecurrentKdaArgs& a = *task.args;
  const auto [kd, vd, kp, vp, bos, eos, head_off] = dims;
  const size_t o_stride = static_cast<size_t>(a.HV) * static_cast<size_t>(vd);
  const int kh = internal::KeyHeadOf(task.h, a.H, a.HV);
  float* scratch = task.scratch;
  float* dst = internal::TokenStateDestination(a, task.n, eos - bos - 1, eos - bos);
  if (dst != nullptr) dst += head_off;
  ShortRows rows;
  rows.scalar_gate = a.scalar_gate;
  rows.delta_correction = a.options.delta_correction;
  rows.skip = a.options.D != nullptr ? a.options.D + task.h : nullptr;
  for (int64_t t0 = bos; t0 < eos; t0 += kShortTokens) {
    const int len = static_cast<int>(eos - t0 < kShortTokens ? eos - t0 : kShortTokens);
    for (int t = 0; t < len; ++t) {
      PrepareToken<Vt>(task, t0 + t, kh, kp, vp, rows.q[t], rows.k[t], rows.e[t], nullptr, rows.v[t], rows.beta[t]);
    }
    const bool last = t0 + len == eos;
    // The state between chunks waits in the scratch; the last chunk's goes to dst (through the scratch
    // for V-first states), or nowhere.
    float* out = !last || a.state_v_first ? scratch : dst;
    if (last && dst == nullptr) out = nullptr;
    // The first chunk reads the state from where it is stored (memory, at real shapes): the next head's
    // (the worker's next task) is prefetched meanwhile.
    const float* next = t0 == bos && !a.state_v_first && initial != nullptr && task.h + 1 < a.HV
                            ? initial + head_off + static_cast<size_t>(kd) * vd
                            : nullptr;
    ShortChunk<Vt>(cur, out, kd, vd, kp, vp, len, rows, a.o, (static_cast<size_t>(t0) * a.HV + task.h) * vd, o_stride,
                   next);
    cur = out;
  }
  if (a.state_v_first && dst != nullptr) CopyState<Vt>(scratch, kd, vd, true, dst);
}

// One task (sequence n, value head h); column blocks of up to NV registers.
// K-major states are stepped from where they are to where the token's state
// goes (in place in a pool slot for plain decode), through the worker's
// scratch for tokens whose state is not written; V-first states likewise, row
// by row in their own layout (DecodeStepVFirst). (Stepping a verification's
// tokens in the scratch and streaming each state out with non-temporal stores,
// which spares the read of a slot written but not read, measured 5–20% slower
// on a Xeon, family 6 model 207: 8 sequences of 4 tokens, states from memory.)
// Sequences of two or more tokens that write at most their final state go
// kShortTokens tokens at a time through ShortChunk (RunShortChunks).
template <class Vt, int NV>
void RunRecurrentTask(const internal::RecurrentTask& task) {
  constexpr int kL = Vt::kLanes;
  const RecurrentKdaArgs& a = *task.args;
  const int kd = a.K;
  const int vd = a.V;
  const int kp = internal::RoundUpTo(kd, kL);
  const int vp = internal::PaddedValueDim(vd, kL);
  const int64_t bos = a.cu_seqlens[task.n];
  const int64_t eos = a.cu_seqlens[task.n + 1];
  const size_t head_off = static_cast<size_t>(task.h) * static_cast<size_t>(kd) * static_cast<size_t>(vd);
  const internal::RecurrentStates st = internal::RecurrentStatesOf(a, task.n);
  if (st.padding) {  // zero outputs, no state touched
    for (int64_t t = bos; t < eos; ++t) {
      const size_t off = static_cast<size_t>(t * a.HV + task.h) * static_cast<size_t>(vd);
      for (int j = 0; j < vd; ++j) StoreScalar(a.o, off + j, 0.0F);
    }
    return;
  }
  const float* cur = st.initial != nullptr ? st.initial + head_off : nullptr;
  float* scratch = task.scratch;
  if (bos == eos) {  // an empty sequence's final state is its initial state (contiguous form), in its layout
    float* empty_final = internal::EmptySequenceFinalState(a, task.n);
    if (empty_final != nullptr && empty_final != st.initial) CopyState<Vt>(cur, kd, vd, false, empty_final + head_off);
    return;
  }
  if (eos - bos >= 2 && OnlyFinalStateWritten(a, task.n, eos - bos)) {
    if (a.state_v_first) {  // short chunks step a K-major working copy
      CopyState<Vt>(cur, vd, kd, true, scratch);
      cur = scratch;
    }
    RunShortChunks<Vt>(task, {kd, vd, kp, vp, bos, eos, head_off}, st.initial, cur);
    return;
  }
  const int kh = internal::KeyHeadOf(task.h, a.H, a.HV);
  alignas(64) float q[kc::kMaxHeadDim];
  alignas(64) float k[kc::kMaxHeadDim];
  alignas(64) float e[kc::kMaxHeadDim];
  alignas(64) float ke[kc::kMaxHeadDim];
  alignas(64) float v[kc::kMaxHeadDim];
  alignas(64) float beta[kc::kMaxHeadDim];
  for (int64_t t = bos; t < eos; ++t) {
    const size_t value_row = static_cast<size_t>(t * a.HV + task.h);
    PrepareToken<Vt>(task, t, kh, kp, vp, q, k, e, ke, v, beta);
    float* dst = internal::TokenStateDestination(a, task.n, t - bos, eos - bos);
    if (dst != nullptr) dst += head_off;
    float* out = dst == nullptr ? scratch : dst;
    const TokenRows rows{q,
                         k,
                         e,
                         a.scalar_gate ? 0 : 1,
                         ke,
                         v,
                         beta,
                         a.options.delta_correction,
                         a.options.D != nullptr ? a.options.D + task.h : nullptr};
    if (a.state_v_first) {
      DecodeStepVFirst<Vt>(cur, out, kd, vd, rows, a.o, value_row * static_cast<size_t>(vd));
    } else {
      if (cur == nullptr) {  // zeros: the step reads the zeroed destination
        CopyState<Vt>(nullptr, kd, vd, false, out);
        cur = out;
      }
      DecodeStep<Vt, NV>(cur, out, kd, vd, rows, a.o, value_row * static_cast<size_t>(vd));
    }
    cur = out;
  }
}

}  // namespace

void FusedRecurrentKdaTask(const internal::RecurrentTask& task) { RunRecurrentTask<Vec, kDecodeRegs>(task); }

}  // namespace kda::KDA_TARGET_NS
