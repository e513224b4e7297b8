// The optimized chunk_kda (prefill) compute code, compiled once per
// instruction set (kernels/isa/target.h) over the target's vector Vec
// (kernels/isa/vec.h). Host side (validation, task split, scratch, threads):
// kernels/kda/kda_optimized.cc; plain reference: chunk_kda_reference.cc.
//
// Prefill (chunk_kda) uses the recurrent form, not the chunked WY form: at
// K = V = 128 the chunked form costs ~182 kflop per token and head against
// 7 K V = 115 kflop for the recurrence (design §3), and the recurrence can be
// run at the FMA rate. Per token t, head h and key row d the state row is kept
// scaled, S[d,:] = c_d * Shat[d,:], with c_d in [kStateRowMinScale, 1]:
//   decay:      c'_d = c_d e^{g_d}                     (Shat untouched)
//   projection: p = S'^T k = sum_d (k_d c'_d) Shat[d,:]      kpre = k c'
//   delta rule: Shat[d,:] += (k_d / c'_d) delta, delta = beta (v - p)   khat = k / c'
//               (without the delta correction p = 0: no projection, two FMAs per element)
//   readout:    o = S''^T (scale q) = sum_d (scale q_d c'_d) Shat[d,:]   qhat = scale q c'
// so every state element costs three FMAs per token (the plain recurrence
// needs a fourth operation, the decay multiply). When c'_d would drop below
// kStateRowMinScale, the row is materialised instead: Shat[d,:] *= mfac_d =
// c_d e^{g_d} (this can be 0 after a -250 gate, as in the reference) and
// c'_d = 1 (khat, qhat use 1), in the pass that updates the token; its
// projection, taken before, uses kpre = k c_d e^{g_d} on the unmaterialised
// row. Only the groups of kPassRowGroup rows holding a materialised row
// multiply, since the multiply is a fourth FP operation per element and token.
// Every exponent fed to Exp is a single gate g <= 0, and c is a running
// product of e^g (never a difference of running gate sums), so there is no
// cancellation.
//
// The value columns of the recurrence are independent, so the state is swept
// in blocks of NV registers of columns ([K][NV*lanes], 16 KiB at K = 128 with
// AVX-512, resident in L1) over a block of kTokenBlock tokens whose per-token
// vectors are prepared once for all column blocks. One pass over the block
// updates and reads out two tokens and projects the state for the next two
// (UpdatePass; the second token's projection, taken before the first token's
// update, is corrected by a scalar): each state element takes three FMAs per
// token and is loaded and stored once per two tokens. (On Zen 3 the AVX2
// sweep of one token per pass ran at ~1.4x its FMA time, bound by the
// state's stores; of two, ~1.1x.) The preparation of the
// next token block (it depends only on the gates, not on the state) runs
// interleaved with the sweeps of the current one, with its input rows
// prefetched a few tokens ahead (see Pipeline), so it does not wait on memory.
// A task advances a few heads of one sequence together, block by block, so
// that their rows of a token, which share pages, share TLB entries.
//
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"
#include "kernels/kda/chunk_state_simd.h"
#include "kernels/kda/kda_states.h"
#include "kernels/kda/kda_tasks.h"
#include "kernels/kda/kda_vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// ------------------------------------------------------------------ prefill

// Software prefetch of input rows. One head's rows of consecutive tokens are
// a token stride apart (H * K elements or more: a new page each at real shapes), so the hardware
// prefetchers do not find them, and a preparation that waits for each row
// from DRAM costs as much as a third of the sweep. Measured on Zen 4: one
// row's worth of prefetches (8 lines) every ~100 ns arrives; bursts of 16 or
// more lines are mostly dropped. So the lines of the next token block are
// listed once (Pipeline::Init) and issued one at a time inside the update passes
// (one every 8 state rows), each about kPrefetchAhead tokens before the
// preparation that reads it. Output rows are prefetched too where their
// stores are plain (ListTokenLines).
using kc::kPassRowGroup;
using kc::kPrefetchAhead;

// Appends the addresses of the cache lines that bytes [p, p + bytes) touch to out (rows need not be aligned).
KDA_INLINE int AppendLines(const void* p, size_t bytes, const void** out) {
  const char* c = static_cast<const char*>(p);
  const auto offset = static_cast<size_t>(reinterpret_cast<uintptr_t>(p) % 64);
  int n = 0;
  for (size_t i = 0; i < offset + bytes; i += 64) out[n++] = c - offset + i;
  return n;
}

// The input lines of token t of the task (q, k, g, v over the task's columns, beta) into out; returns the count.
KDA_INLINE int ListTokenLines(const internal::ChunkTask& task, int64_t t, const void** out) {
  const ChunkKdaArgs& a = *task.args;
  const int kh = internal::KeyHeadOf(task.h, a.H, a.HV);
  const size_t value_row = static_cast<size_t>(t * a.HV + task.h);
  const size_t kd = static_cast<size_t>(a.K);
  const int v_end = task.v_end < a.V ? task.v_end : a.V;
  const size_t width = static_cast<size_t>(v_end - task.v_begin);
  const size_t qkv = DTypeSize(a.q.dtype);
  const size_t gate = DTypeSize(a.g.dtype);
  const size_t gw = a.scalar_gate ? 1 : kd;  // the gate's width
  const size_t v_at = internal::VOffset(a, t, task.h) + static_cast<size_t>(task.v_begin);
  int n = AppendLines(static_cast<const char*>(a.q.data) + internal::QOffset(a, t, kh) * qkv, kd * qkv, out);
  n += AppendLines(static_cast<const char*>(a.k.data) + internal::KOffset(a, t, kh) * qkv, kd * qkv, out + n);
  n += AppendLines(static_cast<const char*>(a.g.data) + value_row * gw * gate, gw * gate, out + n);
  n += AppendLines(static_cast<const char*>(a.v.data) + v_at * qkv, width * qkv, out + n);
  n += AppendLines(static_cast<const char*>(a.beta.data) + value_row * DTypeSize(a.beta.dtype), 1, out + n);
  // The output row, where the update passes store it with plain stores (Streams): each store to a line
  // not in cache waits for it, and at K = V = 100 (rows 400 bytes apart, three in four not aligned for a
  // non-temporal store) those waits filled the store buffer and stalled the next preparation's stores
  // (the kernel alone 9% slower on a Zen 4). An aligned row is streamed: prefetching its lines would only
  // bring in what the non-temporal stores evict (K = V = 128: 8% slower).
  const size_t o_at = value_row * static_cast<size_t>(a.V) + static_cast<size_t>(task.v_begin);
  if (!Streams(a.o, o_at)) {
    const size_t ob = DTypeSize(a.o.dtype);
    n += AppendLines(static_cast<const char*>(a.o.data) + o_at * ob, width * ob, out + n);
  }
  return n;
}

KDA_INLINE void PrefetchLines(const void* const* lines, int n) {
  for (int i = 0; i < n; ++i) __builtin_prefetch(lines[i], 0, 3);
}

// Prepares token t of the task's (sequence, head) into row i of `b` and
// advances the row scales c (task.scratch.c), with c' = c e^g before any
// materialisation:
//   kpre = k c' (projects the state before the token's materialisation),
//   kq = kpre mfac of row i - 1 (projects it before row i - 1's materialisation; row 0: not written),
//   khat = k / c'', qhat = scale q c'' (c'' = 1 on materialised rows, else c'),
//   mfac = c' on materialised rows, else 1; mat = the row groups (kPassRowGroup rows) holding one,
//   gamma = kpre . khat of row i - 1 (row 0: 0), vrow = v over the task's columns.
// (kpre, kq and gamma only with the delta correction: they serve the projections.)
// A scalar gate (GDN, kScalarGate) is one e^g for all rows: one exponential per token, one row scale for
// every row (c'' and its reciprocal computed once, so khat is k times a scalar), all rows materialised
// together.
template <class Vt, bool kScalarGate>
void PrepareTokenOf(const internal::ChunkTask& task, const internal::PrepBuffers& b, int64_t t, int i) {
  using Reg = typename Vt::Reg;
  using Mask = typename Vt::Mask;
  constexpr int kL = Vt::kLanes;
  const ChunkKdaArgs& a = *task.args;
  const KdaOptions& opt = a.options;
  float* c_row = task.scratch.c;
  const int kin = a.K;
  const int kd = internal::PaddedKeyDim(kin, kL);
  const int width = task.v_end - task.v_begin;
  const int key_head = internal::KeyHeadOf(task.h, a.H, a.HV);
  const size_t value_row = static_cast<size_t>(t * a.HV + task.h);
  const size_t at = static_cast<size_t>(i) * static_cast<size_t>(kd);
  float* qh = b.qhat + at;
  float* kh = b.khat + at;
  float* kp = b.kpre + at;
  float* kq = b.kq + at;
  float* mf = b.mfac + at;
  // Row i - 1 (in this block): the token updated just before this one in a two-token pass.
  // Without the delta correction nothing projects the state: no kpre, kq or gamma.
  const bool correct = opt.delta_correction;
  const float* kh_prev = i > 0 && correct ? kh - kd : nullptr;
  const float* mf_prev = i > 0 && correct ? mf - kd : nullptr;
  // q, k and the log decay, zero-padded to kd, staged where their results go (each element is read before
  // its result is written).
  LoadRowPadded<Vt>(a.q, internal::QOffset(a, t, key_head), kin, kd, qh);
  LoadRowPadded<Vt>(a.k, internal::KOffset(a, t, key_head), kin, kd, kh);
  // A scalar gate's row scale: c' = c e^g (every row's), then c'' and 1 / c'', the materialisation factor.
  float c_pre = 1.0F;
  float c_post = 1.0F;
  float c_inv = 1.0F;
  float m_fac = 1.0F;
  if constexpr (kScalarGate) {
    float g = LoadScalar(a.g, value_row);
    if (opt.use_gate_in_kernel) ActivateGate(opt, task.h, 1, &g);
    alignas(64) float e[kL];
    Vt::Store(e, Exp<Vt>(Vt::Set1(g)));
    c_pre = c_row[0] * e[0];
    const bool low = c_pre < kc::kStateRowMinScale;
    m_fac = low ? c_pre : 1.0F;
    c_post = low ? 1.0F : c_pre;
    c_inv = 1.0F / c_post;
  } else {
    LoadRowPadded<Vt>(a.g, value_row * kin, kin, kd, mf);
    if (opt.use_gate_in_kernel) {
      ActivateGate(opt, task.h, kin, mf);
      for (int d = kin; d < kd; ++d) mf[d] = 0.0F;
    }
  }
  float q_mul = task.scale;
  float k_mul = 1.0F;
  if (opt.use_qk_l2norm_in_kernel) {
    q_mul *= InverseNorm<Vt>(qh, kd);
    k_mul = InverseNorm<Vt>(kh, kd);
  }
  const Reg q_scale = Vt::Set1(q_mul);
  const Reg k_scale = Vt::Set1(k_mul);
  const Reg one = Vt::Set1(1.0F);
  const Reg tau = Vt::Set1(kc::kStateRowMinScale);
  Reg gamma = Vt::Zero();
  uint32_t mat = 0;
  // The row groups of a vector's rows [d, d + kL) (d is a multiple of kL; kL divides kPassRowGroup or is a
  // multiple of it).
  constexpr uint32_t kVecGroups = (1U << ((kL + kPassRowGroup - 1) / kPassRowGroup)) - 1U;
  if constexpr (kScalarGate) {
    const Reg pre_mul = Vt::Set1(c_pre);
    const Reg k_mul_post = Vt::Set1(c_inv);
    const Reg q_mul_post = Vt::Mul(q_scale, Vt::Set1(c_post));
    const Reg m = Vt::Set1(m_fac);
    const Reg c = Vt::Set1(c_post);
    for (int d = 0; d < kd; d += kL) {
      const Reg k = opt.use_qk_l2norm_in_kernel ? Vt::Mul(Vt::Load(kh + d), k_scale) : Vt::Load(kh + d);
      const Reg pre = Vt::Mul(k, pre_mul);
      if (correct) Vt::Store(kp + d, pre);
      if (kh_prev != nullptr) {
        Vt::Store(kq + d, Vt::Mul(pre, Vt::Load(mf_prev + d)));
        gamma = Vt::Fma(pre, Vt::Load(kh_prev + d), gamma);
      }
      Vt::Store(mf + d, m);
      Vt::Store(kh + d, Vt::Mul(k, k_mul_post));
      Vt::Store(qh + d, Vt::Mul(Vt::Load(qh + d), q_mul_post));
      Vt::Store(c_row + d, c);
    }
    if (m_fac != 1.0F) mat = ~0U;
  } else {
    for (int d = 0; d < kd; d += kL) {
      const Reg q = Vt::Mul(Vt::Load(qh + d), q_scale);
      const Reg k = opt.use_qk_l2norm_in_kernel ? Vt::Mul(Vt::Load(kh + d), k_scale) : Vt::Load(kh + d);
      Reg c = Vt::Mul(Vt::Load(c_row + d), Exp<Vt>(Vt::Load(mf + d)));
      const Reg pre = Vt::Mul(k, c);
      if (correct) Vt::Store(kp + d, pre);
      if (kh_prev != nullptr) {  // row 0 is never a pass's second token: no kq, no gamma
        Vt::Store(kq + d, Vt::Mul(pre, Vt::Load(mf_prev + d)));
        gamma = Vt::Fma(pre, Vt::Load(kh_prev + d), gamma);
      }
      const Mask low = Vt::Less(c, tau);
      Vt::Store(mf + d, Vt::Select(low, c, one));
      c = Vt::Select(low, one, c);
      if (Vt::Any(low)) mat |= kVecGroups << (d / kPassRowGroup);
      Vt::Store(kh + d, Vt::Div(k, c));
      Vt::Store(qh + d, Vt::Mul(q, c));
      Vt::Store(c_row + d, c);
    }
  }
  b.mat[i] = mat;
  b.gamma[i] = Vt::ReduceAdd(gamma);
  b.beta[i] = ActivateBeta(opt, LoadScalar(a.beta, value_row));
  // v over the task's columns, zero past V.
  const int real = (task.v_end < a.V ? task.v_end : a.V) - task.v_begin;
  LoadRowPadded<Vt>(a.v, internal::VOffset(a, t, task.h) + static_cast<size_t>(task.v_begin), real, width,
                    b.vrow + static_cast<size_t>(i) * width);
}

template <class Vt>
void PrepareToken(const internal::ChunkTask& task, const internal::PrepBuffers& b, int64_t t, int i) {
  if (task.args->scalar_gate) {
    PrepareTokenOf<Vt, true>(task, b, t, i);
  } else {
    PrepareTokenOf<Vt, false>(task, b, t, i);
  }
}

// The work done alongside the sweeps of one token block: preparing the next
// block (n tokens from t0) into `next`, and prefetching its input lines. The
// preparation does not depend on the sweep, only on the row scales, which it
// advances. On a virtual time axis of n + kPrefetchAhead token slots spread
// evenly over the `steps` token steps of the sweeps, token j's lines are
// prefetched during slot j and token j is prepared at the end of slot
// j + kPrefetchAhead.
template <class Vt>
struct Pipeline {
  const internal::ChunkTask* task = nullptr;
  const internal::PrepBuffers* next = nullptr;
  int64_t t0 = 0;
  int n = 0;
  int steps = 1;
  int lines = 0;     // listed lines of the next block (task->scratch.lines)
  int prepared = 0;  // tokens of the next block prepared so far

  // Lists the next block's lines into task->scratch.lines.
  void Init(const internal::ChunkTask& t, const internal::PrepBuffers* buf, int64_t first, int count, int num_steps) {
    task = &t;
    next = buf;
    t0 = first;
    n = count;
    steps = num_steps;
    prepared = 0;
    lines = 0;
    for (int j = 0; j < n; ++j) lines += ListTokenLines(t, t0 + j, t.scratch.lines + lines);
  }
  // The lines to prefetch during steps [s, s + count): [*first, *first + returned). The n tokens' lines
  // span the first n / (n + kPrefetchAhead) of the steps (a line per slot's share when every token has as many).
  int Lines(int s, int count, const void* const** first) const {
    const int64_t span = n > 0 ? static_cast<int64_t>(lines) * (n + kPrefetchAhead) / n : 0;
    int64_t l0 = s * span / steps;
    int64_t l1 = (s + count) * span / steps;
    l0 = l0 < lines ? l0 : lines;
    l1 = l1 < lines ? l1 : lines;
    *first = task->scratch.lines + l0;
    return static_cast<int>(l1 - l0);
  }
  // Prepares the first `count` tokens now where they are not yet (the last pass of a block projects for them).
  void PrepareFirst(int count) {
    for (; prepared < count && prepared < n; ++prepared) PrepareToken<Vt>(*task, *next, t0 + prepared, prepared);
  }
  // Prepares the tokens due by the end of step s.
  void Prepare(int s) {
    while (prepared < n &&
           static_cast<int64_t>(prepared + kPrefetchAhead + 1) * steps / (n + kPrefetchAhead) <= s + 1) {
      PrepareToken<Vt>(*task, *next, t0 + prepared, prepared);
      ++prepared;
    }
  }
};

// The projections of a sequence's first pass (later blocks carry them from the pass before, SweepBlock):
// p += sum_d kpre[d] w[d,:] and, with kTwo, pn += sum_d kq[d] w[d,:] (rows of the block kStride floats apart).
template <class Vt, int NV, int kStride, bool kTwo>
KDA_INLINE void ProjectPass(const float* w, int rows, const float* kpre, const float* kq, typename Vt::Reg* p,
                            typename Vt::Reg* pn) {
  constexpr int kL = Vt::kLanes;
  for (int d = 0; d < rows; ++d) {
    const typename Vt::Reg kp = Vt::Set1(kpre[d]);
    const float* wd = w + static_cast<size_t>(d) * kStride;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const typename Vt::Reg x = Vt::Load(wd + j * kL);
      p[j] = Vt::Fma(kp, x, p[j]);
      if constexpr (kTwo) pn[j] = Vt::Fma(Vt::Set1(kq[d]), x, pn[j]);
    }
  }
}

// The most tokens one update pass advances: two with the delta correction (each token's projection needs the
// state after the token before), four without it (no projections, SweepBlock).
constexpr int kMaxPassTokens = 4;

// The prepared rows one update pass reads: of the tokens it updates (token t of the pass: khat[t], qhat[t],
// mfac[t]), and the projection keys for the next pass's tokens (n: kpre; nn, the second: kq).
struct PassRows {
  const float* khat[kMaxPassTokens] = {};
  const float* qhat[kMaxPassTokens] = {};
  const float* mfac[kMaxPassTokens] = {};
  const float* key_n = nullptr;
  const float* key_nn = nullptr;
};

// acc[j] += s y[j] over a row's NV registers (one broadcast of s).
template <class Vt, int NV>
KDA_INLINE void Axpy(typename Vt::Reg* acc, float s, const typename Vt::Reg* y) {
  const typename Vt::Reg b = Vt::Set1(s);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) acc[j] = Vt::Fma(b, y[j], acc[j]);
}

// One token's step on a state row x (NV registers): materialisation (x *= mfac, with kMaterialise),
// delta-rule update (x += khat delta) and readout (o += qhat x).
template <class Vt, int NV, bool kMaterialise>
KDA_INLINE void TokenStep(typename Vt::Reg* x, float mfac, float khat, const typename Vt::Reg* delta, float qhat,
                          typename Vt::Reg* o) {
  if constexpr (kMaterialise) {
    const typename Vt::Reg m = Vt::Set1(mfac);
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) x[j] = Vt::Mul(x[j], m);
  }
  Axpy<Vt, NV>(x, khat, delta);
  Axpy<Vt, NV>(o, qhat, x);
}

// Which row groups (kPassRowGroup rows) of a pass multiply by the materialisation factors: none, the groups
// whose bit is set in the pass's mask, or all (a pass with most groups set: no branch per group).
enum class Materialise : uint8_t { kNone, kGroups, kAll };

// The registers one update pass works on: per token t of the pass its delta (delta[t], NV registers) and its
// readout accumulators (o[t]); the projections for the next pass's two tokens (p_n, p_nn).
template <class Vt, int NV>
struct PassRegs {
  using Reg = typename Vt::Reg;
  Reg (*delta)[NV];
  Reg (*o)[NV];
  Reg* p_n;
  Reg* p_nn;
};

// Rows [d0, d0 + kPassRowGroup) of an update pass (see UpdatePass), materialised with kMaterialise.
template <class Vt, int NV, int kStride, int kTokens, int kProject, bool kMaterialise>
KDA_INLINE void UpdateRows(float* w, int d0, const PassRows& r, const PassRegs<Vt, NV>& regs) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  for (int d = d0; d < d0 + kPassRowGroup; ++d) {
    float* wd = w + static_cast<size_t>(d) * kStride;
    // One broadcast at a time, used by all NV registers: with two tokens the 6 NV accumulators and
    // deltas, the NV state registers and one broadcast fill AVX2's 16 registers.
    Reg x[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) x[j] = Vt::Load(wd + j * kL);
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
      TokenStep<Vt, NV, kMaterialise>(x, r.mfac[t][d], r.khat[t][d], regs.delta[t], r.qhat[t][d], regs.o[t]);
    }
    if constexpr (kProject > 0) Axpy<Vt, NV>(regs.p_n, r.key_n[d], x);
    if constexpr (kProject == 2) Axpy<Vt, NV>(regs.p_nn, r.key_nn[d], x);
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) Vt::Store(wd + j * kL, x[j]);
  }
}

// One pass over the column block w ([K][kStride], its first NV*lanes columns), row by row: for each token t of
// the pass in turn, its materialisation (w[d,:] *= mfac[t][d], 1 on the rows that are not materialised; per kMode,
// on the groups of rows whose bit is set in `mat`), delta-rule update (w[d,:] += khat[t][d] delta[t]) and readout
// (o[t] += qhat[t][d] w[d,:]); then the projections of the result for the next kProject (0, 1 or 2) tokens:
// p_n += key_n[d] w[d,:], p_nn += key_nn[d] w[d,:]. Each state element is loaded and stored once per pass.
//
// With the delta correction a pass takes two tokens, both updates in one pass, so token 1's projection is taken
// from the state before token 0's update (the previous pass's p_nn, with key kq_1 = kpre_1 mfac_0) and corrected
// once delta_0 is known:
//   p_1 = sum_d kpre_1[d] (mfac_0[d] w[d,:] + khat_0[d] delta_0) = p_nn + gamma_1 delta_0,
// gamma_1 = kpre_1 . khat_0 (PrepareToken). Without it (no projections) a pass takes up to four. Issues the
// prefetches pf[0, npf), one per row group.
template <class Vt, int NV, int kStride, int kTokens, int kProject, Materialise kMode>
KDA_INLINE void UpdatePass(float* w, int rows, uint32_t mat, const PassRows& r, const PassRegs<Vt, NV>& regs,
                           const void* const* pf, int npf) {
  int issued = 0;
  for (int d0 = 0; d0 < rows; d0 += kPassRowGroup) {
    if (issued < npf) __builtin_prefetch(pf[issued++], 0, 3);
    const bool group =
        kMode == Materialise::kAll || (kMode == Materialise::kGroups && ((mat >> (d0 / kPassRowGroup)) & 1U) != 0);
    if (group) {
      UpdateRows<Vt, NV, kStride, kTokens, kProject, true>(w, d0, r, regs);
    } else {
      UpdateRows<Vt, NV, kStride, kTokens, kProject, false>(w, d0, r, regs);
    }
  }
  PrefetchLines(pf + issued, npf - issued);
}

// UpdatePass with its materialisation chosen from the mask of row groups `mat`.
template <class Vt, int NV, int kStride, int kTokens, int kProject>
KDA_INLINE void UpdatePassMat(float* w, int rows, uint32_t mat, const PassRows& r, const PassRegs<Vt, NV>& regs,
                              const void* const* pf, int npf) {
  // A group branch the predictor misses costs about what multiplying a group does: past half the groups set,
  // every group multiplies.
  if (mat == 0) {
    UpdatePass<Vt, NV, kStride, kTokens, kProject, Materialise::kNone>(w, rows, mat, r, regs, pf, npf);
  } else if (2 * __builtin_popcount(mat) * kPassRowGroup > rows) {
    UpdatePass<Vt, NV, kStride, kTokens, kProject, Materialise::kAll>(w, rows, mat, r, regs, pf, npf);
  } else {
    UpdatePass<Vt, NV, kStride, kTokens, kProject, Materialise::kGroups>(w, rows, mat, r, regs, pf, npf);
  }
}

// UpdatePassMat with its projections (0, 1 or 2) chosen at run time (none for a pass of four tokens).
template <class Vt, int NV, int kStride, int kTokens>
KDA_INLINE void UpdatePassAny(int project, uint32_t mat, float* w, int rows, const PassRows& r,
                              const PassRegs<Vt, NV>& regs, const void* const* pf, int npf) {
  if constexpr (kTokens == 4) {
    UpdatePassMat<Vt, NV, kStride, 4, 0>(w, rows, mat, r, regs, pf, npf);
  } else if (project == 2) {
    UpdatePassMat<Vt, NV, kStride, kTokens, 2>(w, rows, mat, r, regs, pf, npf);
  } else if (project == 1) {
    UpdatePassMat<Vt, NV, kStride, kTokens, 1>(w, rows, mat, r, regs, pf, npf);
  } else {
    UpdatePassMat<Vt, NV, kStride, kTokens, 0>(w, rows, mat, r, regs, pf, npf);
  }
}

// The first n (< NV * lanes) columns of a block's output registers (a V tail).
template <class Vt, int NV>
KDA_INLINE void StoreColumnsPart(const MutBuf& buf, size_t offset, const typename Vt::Reg* o, int n) {
  constexpr int kL = Vt::kLanes;
  for (int j = 0; j < NV && j * kL < n; ++j) {
    const size_t at = offset + static_cast<size_t>(j) * kL;
    if (n - j * kL >= kL) {
      StoreOut<Vt>(buf, at, o[j]);
    } else {
      StoreOutPart<Vt>(buf, at, o[j], n - j * kL);
    }
  }
}

// One token block's sweep of a head: the prepared block `cur` (nt tokens from t0); the next block is the
// pipeline's. The last pass over a column block projects the state for the next block's first pass, and the
// projections wait in the head's scratch (proj) until then; only a sequence's first block starts each column
// block with a pass of projections alone (carried = false).
struct BlockSweep {
  const internal::PrepBuffers* cur = nullptr;
  int64_t t0 = 0;
  int nt = 0;
  bool carried = false;
};

// Runs the prepared tokens of bs through one column block: columns [col, col + NV*lanes) of the task (its
// [K][NV*lanes] state in the scratch), two tokens per pass where the registers hold them (the last pass of an
// odd block: one), four without the delta correction. Token i also does step `step0 + i` of the pipeline. The
// block's arithmetic runs on NV registers of Rt: Vt's own, or (a V tail of at most HalfVec's lanes, NV = 1)
// HalfVec's over the first half of each row.
template <class Vt, int NV, class Rt = Vt>
void SweepBlock(const internal::ChunkTask& task, const BlockSweep& bs, int col, Pipeline<Vt>& pipe, int step0) {
  using Reg = typename Rt::Reg;
  constexpr int kL = Rt::kLanes;
  constexpr int kStride = NV * Vt::kLanes;  // of the block's state rows
  // Two tokens keep 6 NV accumulators and deltas, NV state registers and a broadcast live; four tokens without
  // projections 8 NV accumulators and deltas.
  constexpr bool kPairs = 7 * NV + 1 <= kVecRegisters;
  constexpr bool kQuads = 9 * NV + 1 <= kVecRegisters;
  const ChunkKdaArgs& a = *task.args;
  const internal::PrepBuffers& b = *bs.cur;
  const int nt = bs.nt;
  const int kd = internal::PaddedKeyDim(a.K, Vt::kLanes);  // the stride of the prepared rows and the state block
  const int rows = internal::SweepRows(a.K);               // the rows swept
  const int width = task.v_end - task.v_begin;
  // Output lanes of this column block that are real columns (< V): all of them except past a V tail.
  const int real_cols = a.V - (task.v_begin + col);
  const auto kdz = static_cast<size_t>(kd);
  float* w = task.scratch.state + kdz * col;
  auto row = [kdz](const float* base, int i) { return base + static_cast<size_t>(i) * kdz; };
  // Without the delta correction no pass projects the state (p and pn stay zero, delta = beta v), and a pass
  // takes four tokens where the registers hold them.
  const bool correct = a.options.delta_correction;
  const float* skip = a.options.D != nullptr ? a.options.D + task.h : nullptr;  // the head's D
  // Tokens of the pass starting at token i of a block of n.
  auto tokens_at = [correct](int i, int n) {
    if (kQuads && !correct && i + 3 < n) return 4;
    return kPairs && i + 1 < n ? 2 : 1;
  };
  // The carried projections: p of the task's columns, then pn.
  float* proj_p = task.scratch.proj + col;
  float* proj_pn = task.scratch.proj + width + col;
  Reg p[NV];   // the projection of the pass's first token
  Reg pn[NV];  // of its second token, before the first token's update
  for (int j = 0; j < NV; ++j) {
    p[j] = bs.carried ? Rt::Load(proj_p + j * kL) : Rt::Zero();
    pn[j] = bs.carried ? Rt::Load(proj_pn + j * kL) : Rt::Zero();
  }
  if (!bs.carried && correct) {
    if (tokens_at(0, nt) == 2) {
      ProjectPass<Rt, NV, kStride, true>(w, rows, b.kpre, row(b.kq, 1), p, pn);
    } else {
      ProjectPass<Rt, NV, kStride, false>(w, rows, b.kpre, nullptr, p, pn);
    }
  }
  // The pass of kTokens tokens from token i (its registers indexed by constants only, so that they stay in
  // registers).
  const auto pass = [&](int i, auto tokens_constant) __attribute__((always_inline)) {
    constexpr int kTokens = decltype(tokens_constant)::value;
    const int next = i + kTokens;  // the next pass's first token
    const void* const* pf = nullptr;
    const int npf = pipe.Lines(step0 + i, kTokens, &pf);
    Reg o[kTokens][NV];
    Reg delta[kTokens][NV];
    PassRows r;
    uint32_t mat = 0;
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
      const float* v = b.vrow + static_cast<size_t>(i + t) * width + col;
      const Reg beta = Rt::Set1(b.beta[i + t]);
      for (int j = 0; j < NV; ++j) {
        // Token 1 of a pair projects through the previous pass's pn, corrected by token 0's delta (UpdatePass).
        Reg proj = Rt::Zero();
        if (correct && t == 0) proj = p[j];
        if (correct && t == 1) proj = Rt::Fma(Rt::Set1(b.gamma[i + 1]), delta[0][j], pn[j]);
        delta[t][j] = Rt::Mul(beta, Rt::Sub(Rt::Load(v + j * kL), proj));
        o[t][j] = Rt::Zero();
      }
      r.khat[t] = row(b.khat, i + t);
      r.qhat[t] = row(b.qhat, i + t);
      r.mfac[t] = row(b.mfac, i + t);
      mat |= b.mat[i + t];
    }
    // The next pass's tokens and keys: in this block, else the next block's first (prepared now if not yet).
    int project = 0;
    if (correct && next < nt) {
      project = tokens_at(next, nt);
      r.key_n = row(b.kpre, next);
      if (project == 2) r.key_nn = row(b.kq, next + 1);
    } else if (correct && pipe.n > 0) {
      project = tokens_at(0, pipe.n);
      pipe.PrepareFirst(project);
      r.key_n = pipe.next->kpre;
      if (project == 2) r.key_nn = row(pipe.next->kq, 1);
    }
    for (int j = 0; j < NV; ++j) {
      p[j] = Rt::Zero();
      pn[j] = Rt::Zero();
    }
    UpdatePassAny<Rt, NV, kStride, kTokens>(project, mat, w, rows, r, PassRegs<Rt, NV>{delta, o, p, pn}, pf, npf);
    const auto token_row = static_cast<size_t>(a.HV) * static_cast<size_t>(a.V);
    const size_t out = static_cast<size_t>((bs.t0 + i) * a.HV + task.h) * static_cast<size_t>(a.V) +
                       static_cast<size_t>(task.v_begin + col);
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
      const size_t out_t = out + static_cast<size_t>(t) * token_row;
      if (skip != nullptr) {  // Mamba2's skip: o + D v
        const float* v = b.vrow + static_cast<size_t>(i + t) * width + col;
        for (int j = 0; j < NV; ++j) o[t][j] = Rt::Fma(Rt::Set1(*skip), Rt::Load(v + j * kL), o[t][j]);
      }
      if (real_cols >= NV * kL) {
        for (int j = 0; j < NV; ++j) StreamOut<Rt>(a.o, out_t + static_cast<size_t>(j) * kL, o[t][j]);
      } else {
        StoreColumnsPart<Rt, NV>(a.o, out_t, o[t], real_cols);
      }
    }
    for (int k = i; k < next; ++k) pipe.Prepare(step0 + k);
  };
  for (int i = 0; i < nt;) {
    const int tokens = tokens_at(i, nt);
    if constexpr (kQuads) {
      if (tokens == 4) pass(i, std::integral_constant<int, 4>{});
    }
    if (tokens == 2) pass(i, std::integral_constant<int, 2>{});
    if (tokens == 1) pass(i, std::integral_constant<int, 1>{});
    i += tokens;
  }
  if (pipe.n == 0) return;
  for (int j = 0; j < NV; ++j) {
    Rt::Store(proj_p + j * kL, p[j]);
    Rt::Store(proj_pn + j * kL, pn[j]);
  }
}

// A column block of nv registers (1 <= nv <= 4).
template <class Vt>
void SweepAny(int nv, const internal::ChunkTask& task, const BlockSweep& bs, int col, Pipeline<Vt>& pipe, int step0) {
  switch (nv) {
    case 1:
      SweepBlock<Vt, 1>(task, bs, col, pipe, step0);
      return;
    case 2:
      SweepBlock<Vt, 2>(task, bs, col, pipe, step0);
      return;
    case 3:
      SweepBlock<Vt, 3>(task, bs, col, pipe, step0);
      return;
    default:
      SweepBlock<Vt, 4>(task, bs, col, pipe, step0);
      return;
  }
}

// Prepares the head's first token block (n tokens from t0) into prep[0], prefetching as it goes.
template <class Vt>
void PrepareFirstBlock(const internal::ChunkTask& task, int64_t t0, int n) {
  const internal::ChunkScratch& s = task.scratch;
  for (int i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) PrefetchLines(s.lines, ListTokenLines(task, t0 + i + kPrefetchAhead, s.lines));
    PrepareToken<Vt>(task, s.prep[0], t0 + i, i);
  }
}

// Sweeps the head's prepared block (nt tokens from t0, in prep[cur]) through
// all its column blocks while preparing the next block (next_n tokens) into
// prep[1 - cur]. carried: the block is not the sequence's first.
template <class Vt, int NV>
void SweepHead(const internal::ChunkTask& task, int cur, int64_t t0, int nt, int next_n, bool carried) {
  constexpr int kL = Vt::kLanes;
  constexpr int kB = NV * kL;
  const ChunkKdaArgs& a = *task.args;
  const internal::ChunkScratch& s = task.scratch;
  const int width = task.v_end - task.v_begin;
  Pipeline<Vt> pipe;
  pipe.Init(task, &s.prep[1 - cur], t0 + nt, next_n, (width + kB - 1) / kB * nt);
  BlockSweep bs;
  bs.cur = &s.prep[cur];
  bs.t0 = t0;
  bs.nt = nt;
  bs.carried = carried;
  for (int col = 0; col < width; col += kB) {
    const int step0 = col / kB * nt;
    if (width - col >= kB) {
      SweepBlock<Vt, NV>(task, bs, col, pipe, step0);
    } else if (HalfVec::kLanes < kL && width - col == kL && a.V - (task.v_begin + col) <= HalfVec::kLanes) {
      // A V tail of at most half a register (V = 100 with 16 lanes: 4 columns) on half-width registers.
      SweepBlock<Vt, 1, HalfVec>(task, bs, col, pipe, step0);
    } else {
      SweepAny<Vt>((width - col) / kL, task, bs, col, pipe, step0);
    }
  }
}

// One chunk task (see kernels/kda/kda_tasks.h) with column blocks of NV registers: its
// heads advance together one token block at a time.
template <class Vt, int NV>
void RunChunkTask(const internal::ChunkGroupTask& group) {
  const ChunkKdaArgs& a = *group.args;
  const int64_t bos = a.cu_seqlens[group.n];
  const int64_t eos = a.cu_seqlens[group.n + 1];
  internal::ChunkTask heads[kc::kHeadGroup]{};
  for (int g = 0; g < group.heads; ++g) {
    internal::ChunkTask& t = heads[g];
    t.args = group.args;
    t.n = group.n;
    t.h = group.h + g;
    t.initial = group.initial;
    t.final = group.final;
    t.v_begin = group.v_begin;
    t.v_end = group.v_end;
    t.scale = group.scale;
    t.scratch = group.scratch[g];
    LoadState<Vt, NV>(t);
  }
  // The first block is prepared up front; each later one during the sweeps of the block before it.
  const int first = eos - bos < kc::kTokenBlock ? static_cast<int>(eos - bos) : kc::kTokenBlock;
  for (int g = 0; g < group.heads; ++g) PrepareFirstBlock<Vt>(heads[g], bos, first);
  // Snapshots (offsets are multiples of kSnapshotGrain, so block ends, or the length). The sweep of a block
  // prepares the next one, which advances the row scales past the block: the scales at its end are saved first.
  static_assert(kSnapshotGrain % kc::kTokenBlock == 0, "snapshot offsets must be token block ends");
  int64_t snap = a.snapshot_cu != nullptr ? a.snapshot_cu[group.n] : 0;
  const int64_t snap_end = a.snapshot_cu != nullptr ? a.snapshot_cu[group.n + 1] : 0;
  int cur = 0;
  for (int64_t t0 = bos; t0 < eos; t0 += kc::kTokenBlock) {
    const int nt = eos - t0 < kc::kTokenBlock ? static_cast<int>(eos - t0) : kc::kTokenBlock;
    const int64_t next = t0 + nt;
    const int next_n = eos - next < kc::kTokenBlock ? static_cast<int>(eos - next) : kc::kTokenBlock;
    const bool snapshot = snap < snap_end && a.snapshot_offsets[snap] == next - bos;
    if (snapshot) {
      for (int g = 0; g < group.heads; ++g) {
        for (int d = 0; d < internal::PaddedKeyDim(a.K, Vt::kLanes); ++d) {
          heads[g].scratch.c_end[d] = heads[g].scratch.c[d];
        }
      }
    }
    for (int g = 0; g < group.heads; ++g) SweepHead<Vt, NV>(heads[g], cur, t0, nt, next_n, t0 != bos);
    if (snapshot) {
      for (int g = 0; g < group.heads; ++g)
        StoreState<Vt, NV>(heads[g], heads[g].scratch.c_end, {a.snapshot_states[snap], a.snapshot_dtype});
      ++snap;
    }
    cur = 1 - cur;
  }
#if KDA_HAS_STREAM_STORES
  VecStream::Fence();  // the outputs' streaming stores, before any reader
#endif
  if (group.final == nullptr) return;
  for (int g = 0; g < group.heads; ++g) StoreState<Vt, NV>(heads[g], heads[g].scratch.c, {group.final, DType::kF32});
}

}  // namespace

void ChunkKdaTask(const internal::ChunkGroupTask& task) { RunChunkTask<Vec, kChunkRegs>(task); }

int ChunkColumnBlock() { return kChunkRegs * Vec::kLanes; }

}  // namespace kda::KDA_TARGET_NS
