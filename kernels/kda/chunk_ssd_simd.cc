// The optimized chunk_kda of Mamba2's SSD (a scalar gate, no delta correction; kernels/kda/kda_optimized.cc routes
// those calls here), compiled once per instruction set; plain reference: chunk_kda_reference.cc.
//
// Without the delta correction the recurrence S_t = e^{g_t} S_{t-1} + beta_t k_t v_t^T, o_t = scale S_t^T q_t
// (+ D v_t) has a chunked form without a triangular solve. Within a chunk of L tokens from the state S, with the
// segment sums s(i, c) = g_{c+1} + ... + g_i (c <= i) and a_i = g_0 + ... + g_i:
//   o_i    = scale e^{a_i} q_i^T S + sum_{c <= i} scale beta_c e^{s(i, c)} (q_i . k_c) v_c   (+ D v_i)
//   S_next = e^{a_{L-1}} S + sum_c beta_c e^{s(L-1, c)} k_c v_c^T
// Per head and chunk that is three matrix products: the readout Q S, the intra-chunk M V (M the causal weights
// above) and the update K^T V_w (V_w the rows v_c beta_c e^{s(L-1, c)}); about 4 K V + (L + 1) V flops per token
// and head against the recurrence's 4 K V, but each product runs as register tiles of R rows by NV registers that
// load a row of the right operand once for R broadcasts, where the recurrent form (chunk_kda_simd.cc) loads and
// stores the state every few tokens and broadcasts once per two FMAs. The decays e^{s(i, c)} are running products
// of the chunk's own e^{g} (each rounded once, as the recurrence's state is; below the smallest normal float, 0);
// e^{a_i} is the exponential of a running sum of the chunk's gates (<= 0: no difference of running sums, no
// cancellation). The products q_i . k_c belong to the key head: a task (value heads of one key head) computes them
// once per chunk for all its heads.
//
// A task advances its heads span by span (kc::kSsdSpan tokens of whole chunks, their q and k rows prepared once),
// chunk by chunk within a span, every head of the task through a chunk before the next (their working states in
// the worker's scratch; the heads' rows of a token are adjacent). A chunk ends at kc::kSsdChunk tokens, at the
// sequence's end, or at a snapshot offset, where each head's state is written as it leaves the chunk.
#include <cstddef>
#include <cstdint>
#include <type_traits>

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

using kc::kSsdChunk;
using kc::kSsdSpan;

// Rows of a register tile: R rows of NV accumulator registers, NV registers of the right operand's row and one
// broadcast fit the target's registers (AVX2: 6 x 2 + 2 + 1 of 16; AVX-512: 12 x 2 + 2 + 1 of 32).
constexpr int kTileRows = kVecRegisters == 32 ? 12 : 6;
// The most chunks of one span: a chunk is kSsdChunk tokens, or ends at a snapshot (offsets kSnapshotGrain
// apart at least) or at the sequence's end.
constexpr int kMaxSpanChunks = kSsdSpan / static_cast<int>(kSnapshotGrain) + 2;

// Lane j holds j: the column index of a register's lanes.
alignas(64) constexpr float kLaneIndex[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// acc[r][j] += sum_{p < n} a[r ar + p ap] b[p bs + j lanes], for the R rows and NV registers of a tile.
template <class Vt, int R, int NV>
KDA_INLINE void TileProduct(typename Vt::Reg (&acc)[R][NV], const float* a, size_t ar, size_t ap, const float* b,
                            size_t bs, int n) {
  constexpr int kL = Vt::kLanes;
  for (int p = 0; p < n; ++p) {
    const float* bp = b + static_cast<size_t>(p) * bs;
    const float* a_p = a + static_cast<size_t>(p) * ap;
    typename Vt::Reg x[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) x[j] = Vt::Load(bp + j * kL);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const typename Vt::Reg s = Vt::Set1(a_p[static_cast<size_t>(r) * ar]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] = Vt::Fma(s, x[j], acc[r][j]);
    }
  }
}

// fn(std::integral_constant<int, rows>) for rows in [1, R].
template <int R, class Fn>
KDA_INLINE void WithRows(int rows, Fn&& fn) {
  if constexpr (R > 1) {
    if (rows < R) {
      WithRows<R - 1>(rows, fn);
      return;
    }
  }
  fn(std::integral_constant<int, R>{});
}

// One chunk of a span, shared by the task's heads: its first token (in the packed tokens), its length, its rows of
// the span's q, k and q . k, and the snapshot it ends at (-1: none).
struct SsdChunk {
  int64_t t0 = 0;
  int len = 0;
  const float* q = nullptr;  // [len][K'], the in-kernel norm applied
  const float* k = nullptr;  // [len][K']
  float* qk = nullptr;       // [len][kSsdChunk]: q_i . k_c for c <= i, zeros after (to whole registers)
  int64_t snapshot = -1;
};

// The q and k rows of the span's tokens [t0, t0 + n) of key head kh into the scratch, and each chunk's q . k.
template <class Vt>
void PrepareSpan(const internal::SsdTask& task, int kh, int64_t t0, int n, const SsdChunk* chunks, int count) {
  constexpr int kL = Vt::kLanes;
  const ChunkKdaArgs& a = *task.args;
  const internal::SsdScratch& s = task.scratch;
  const int kd = internal::PaddedKeyDim(a.K, kL);
  for (int i = 0; i < n; ++i) {
    float* q = s.q + static_cast<size_t>(i) * kd;
    float* k = s.k + static_cast<size_t>(i) * kd;
    LoadRowPadded<Vt>(a.q, internal::QOffset(a, t0 + i, kh), a.K, kd, q);
    LoadRowPadded<Vt>(a.k, internal::KOffset(a, t0 + i, kh), a.K, kd, k);
    if (!a.options.use_qk_l2norm_in_kernel) continue;
    const typename Vt::Reg q_norm = Vt::Set1(InverseNorm<Vt>(q, kd));
    const typename Vt::Reg k_norm = Vt::Set1(InverseNorm<Vt>(k, kd));
    for (int d = 0; d < kd; d += kL) {
      Vt::Store(q + d, Vt::Mul(Vt::Load(q + d), q_norm));
      Vt::Store(k + d, Vt::Mul(Vt::Load(k + d), k_norm));
    }
  }
  for (int ci = 0; ci < count; ++ci) {
    const SsdChunk& c = chunks[ci];
    for (int i = 0; i < c.len; ++i) {
      const float* qi = c.q + static_cast<size_t>(i) * kd;
      float* row = c.qk + static_cast<size_t>(i) * kSsdChunk;
      for (int j = 0; j <= i; ++j) {
        const float* kj = c.k + static_cast<size_t>(j) * kd;
        typename Vt::Reg acc = Vt::Zero();
        for (int d = 0; d < kd; d += kL) acc = Vt::Fma(Vt::Load(qi + d), Vt::Load(kj + d), acc);
        row[j] = Vt::ReduceAdd(acc);
      }
      for (int j = i + 1; j < internal::RoundUpTo(i + 1, kL); ++j) row[j] = 0.0F;
    }
  }
}

// Value head h's weights of chunk c into the scratch: m [len][kSsdChunk] = scale beta_c e^{s(i, c)} q_i . k_c for
// c <= i, zeros after (to len rounded up to whole registers); readout [len] = scale e^{a_i}; v [len][V'] its v rows
// and vw [len][V'] = beta_c e^{s(len - 1, c)} v_c. Returns e^{a_{len - 1}}, the decay of the state over the chunk.
template <class Vt>
float PrepareHeadChunk(const internal::SsdTask& task, int h, const SsdChunk& c) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  const ChunkKdaArgs& a = *task.args;
  const internal::SsdScratch& s = task.scratch;
  const int len = c.len;
  const int lp = internal::RoundUpTo(len, kL);
  const int vp = internal::PaddedValueDim(a.V, kL);
  // Gates and betas (zeros past len), and the running sums a_i.
  float run = 0.0F;
  for (int i = 0; i < lp; ++i) {
    float g = 0.0F;
    float beta = 0.0F;
    if (i < len) {
      const auto row = static_cast<size_t>((c.t0 + i) * a.HV + h);
      g = LoadScalar(a.g, row);
      if (a.options.use_gate_in_kernel) ActivateGate(a.options, h, 1, &g);
      beta = ActivateBeta(a.options, LoadScalar(a.beta, row));
      run += g;
    }
    s.g[i] = g;
    s.beta[i] = beta;
    s.readout[i] = run;
    s.decay[i] = 0.0F;
  }
  const float state_decay = Exp<Scalar>(s.readout[len - 1]);
  const Reg scale = Vt::Set1(task.scale);
  for (int j = 0; j < lp; j += kL) Vt::Store(s.readout + j, Vt::Mul(scale, Exp<Vt>(Vt::Load(s.readout + j))));
  // Row i of m from the decays e^{s(i, c)} = e^{s(i - 1, c)} e^{g_i} (c < i; 1 at c = i, 0 after), kept in s.decay: a
  // running product of the chunk's own e^g, each rounded once, as the recurrence's state is (a product below the
  // smallest normal float is 0, as Exp's result is there).
  for (int j = 0; j < lp; j += kL) Vt::Store(s.g + j, Exp<Vt>(Vt::Load(s.g + j)));
  const Reg lane = Vt::Load(kLaneIndex);
  const Reg one = Vt::Set1(1.0F);
  const Reg tiny = Vt::Set1(kc::kSmallestNormal);
  for (int i = 0; i < len; ++i) {
    const Reg ei = Vt::Set1(s.g[i]);
    const Reg ii = Vt::Set1(static_cast<float>(i));
    const float* qk = c.qk + static_cast<size_t>(i) * kSsdChunk;
    float* m = s.m + static_cast<size_t>(i) * kSsdChunk;
    s.decay[i] = 1.0F;
    const int live = internal::RoundUpTo(i + 1, kL);
    for (int j = 0; j < live; j += kL) {
      const Reg col = Vt::Add(lane, Vt::Set1(static_cast<float>(j)));
      Reg d = Vt::Mul(Vt::Load(s.decay + j), Vt::Select(Vt::Less(col, ii), ei, one));
      d = Vt::Select(Vt::Less(d, tiny), Vt::Zero(), d);
      Vt::Store(s.decay + j, d);
      Vt::Store(m + j, Vt::Mul(Vt::Mul(Vt::Load(qk + j), Vt::Load(s.beta + j)), Vt::Mul(scale, d)));
    }
    for (int j = live; j < lp; j += kL) Vt::Store(m + j, Vt::Zero());
  }
  // s.decay now holds e^{s(len - 1, c)}: the update's weights beta_c e^{s(len - 1, c)} (0 past len: beta is 0 there).
  for (int j = 0; j < lp; j += kL) Vt::Store(s.update + j, Vt::Mul(Vt::Load(s.beta + j), Vt::Load(s.decay + j)));
  // The next head's v and o rows of the chunk, into cache while this head's products run (one head's rows of
  // consecutive tokens are a token stride apart: the hardware prefetchers do not find them).
  if (h + 1 < task.h + task.heads) {
    const size_t v_bytes = static_cast<size_t>(a.V) * DTypeSize(a.v.dtype);
    const size_t o_bytes = static_cast<size_t>(a.V) * DTypeSize(a.o.dtype);
    for (int i = 0; i < len; ++i) {
      const char* v = static_cast<const char*>(a.v.data) + internal::VOffset(a, c.t0 + i, h + 1) * DTypeSize(a.v.dtype);
      const char* o = static_cast<const char*>(a.o.data) + ((c.t0 + i) * a.HV + h + 1) * o_bytes;
      for (size_t b = 0; b < v_bytes; b += 64) __builtin_prefetch(v + b, 0, 3);
      for (size_t b = 0; b < o_bytes; b += 64) __builtin_prefetch(o + b, 1, 3);
    }
  }
  for (int i = 0; i < len; ++i) {
    float* v = s.v + static_cast<size_t>(i) * vp;
    float* vw = s.vw + static_cast<size_t>(i) * vp;
    LoadRowPadded<Vt>(a.v, internal::VOffset(a, c.t0 + i, h), a.V, vp, v);
    const Reg w = Vt::Set1(s.update[i]);
    for (int j = 0; j < vp; j += kL) Vt::Store(vw + j, Vt::Mul(w, Vt::Load(v + j)));
  }
  return state_decay;
}

// Where one column block of a head's working state is: its first value column c0, its columns < V (real), its
// rows w [K'][NV lanes].
struct SsdBlock {
  int c0 = 0;
  int real = 0;
  float* w = nullptr;
};

// Chunk c of value head h over one column block: the outputs of its rows [i0, i0 + R) from the state before the
// chunk (the readout, the intra-chunk product and the skip), rounded once into o.
template <class Vt, int R, int NV>
KDA_INLINE void ReadoutTile(const internal::SsdTask& task, int h, const SsdChunk& c, const SsdBlock& b, int i0,
                            const float* skip) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  constexpr int kB = NV * kL;
  const ChunkKdaArgs& a = *task.args;
  const internal::SsdScratch& s = task.scratch;
  const int kd = internal::PaddedKeyDim(a.K, kL);
  const auto vp = static_cast<size_t>(internal::PaddedValueDim(a.V, kL));
  Reg acc[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[r][j] = Vt::Zero();
  }
  TileProduct<Vt, R, NV>(acc, c.q + static_cast<size_t>(i0) * kd, static_cast<size_t>(kd), 1, b.w, kB, kd);
  const float* v = s.v + b.c0;
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    const Reg f = Vt::Set1(s.readout[i0 + r]);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[r][j] = Vt::Mul(acc[r][j], f);
  }
  TileProduct<Vt, R, NV>(acc, s.m + static_cast<size_t>(i0) * kSsdChunk, kSsdChunk, 1, v, vp, i0 + R);
  for (int r = 0; r < R; ++r) {
    const float* vr = v + static_cast<size_t>(i0 + r) * vp;
    const size_t at = (static_cast<size_t>(c.t0 + i0 + r) * a.HV + h) * a.V + b.c0;
    for (int j = 0; j < NV && j * kL < b.real; ++j) {
      Reg x = acc[r][j];
      if (skip != nullptr) x = Vt::Fma(Vt::Set1(*skip), Vt::Load(vr + j * kL), x);  // Mamba2's skip: o + D v
      if (b.real - j * kL >= kL) {
        StoreOut<Vt>(a.o, at + j * kL, x);
      } else {
        StoreOutPart<Vt>(a.o, at + j * kL, x, b.real - j * kL);
      }
    }
  }
}

// Rows [d0, d0 + R) of one column block of the state past chunk c: S = decay S + K^T V_w.
template <class Vt, int R, int NV>
KDA_INLINE void UpdateTile(const internal::SsdTask& task, const SsdChunk& c, const SsdBlock& b, int d0, float decay) {
  using Reg = typename Vt::Reg;
  constexpr int kL = Vt::kLanes;
  constexpr int kB = NV * kL;
  const ChunkKdaArgs& a = *task.args;
  const int kd = internal::PaddedKeyDim(a.K, kL);
  const auto vp = static_cast<size_t>(internal::PaddedValueDim(a.V, kL));
  const Reg f = Vt::Set1(decay);
  float* w = b.w + static_cast<size_t>(d0) * kB;
  Reg acc[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[r][j] = Vt::Mul(f, Vt::Load(w + r * kB + j * kL));
  }
  TileProduct<Vt, R, NV>(acc, c.k + d0, 1, static_cast<size_t>(kd), task.scratch.vw + b.c0, vp, c.len);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) Vt::Store(w + r * kB + j * kL, acc[r][j]);
  }
}

// Chunk c of value head h over one column block of NV registers: every output row, then the state's update.
template <class Vt, int NV>
void BlockChunk(const internal::SsdTask& task, int h, const SsdChunk& c, const SsdBlock& b, float decay,
                const float* skip) {
  const int kd = internal::PaddedKeyDim(task.args->K, Vt::kLanes);
  for (int i0 = 0; i0 < c.len; i0 += kTileRows) {
    WithRows<kTileRows>(c.len - i0, [&](auto rows) { ReadoutTile<Vt, rows(), NV>(task, h, c, b, i0, skip); });
  }
  for (int d0 = 0; d0 < kd; d0 += kTileRows) {
    WithRows<kTileRows>(kd - d0, [&](auto rows) { UpdateTile<Vt, rows(), NV>(task, c, b, d0, decay); });
  }
}

// The view of value head g of the task (its working state in the scratch, every value column) that the state
// loads and stores take.
internal::ChunkTask HeadView(const internal::SsdTask& task, int g, int kd, int vp) {
  internal::ChunkTask t;
  t.args = task.args;
  t.n = task.n;
  t.h = task.h + g;
  t.initial = task.initial;
  t.final = task.final;
  t.v_begin = 0;
  t.v_end = vp;
  t.scale = task.scale;
  t.scratch.state = task.scratch.states + static_cast<size_t>(g) * kd * vp;
  t.scratch.c = task.scratch.ones;
  return t;
}

template <class Vt>
void RunSsdTask(const internal::SsdTask& task) {
  constexpr int kL = Vt::kLanes;
  constexpr int kB = kChunkRegs * kL;
  const ChunkKdaArgs& a = *task.args;
  const internal::SsdScratch& s = task.scratch;
  const int kd = internal::PaddedKeyDim(a.K, kL);
  const int vp = internal::PaddedValueDim(a.V, kL);
  const int kh = internal::KeyHeadOf(task.h, a.H, a.HV);
  for (int g = 0; g < task.heads; ++g) LoadState<Vt, kChunkRegs>(HeadView(task, g, kd, vp));
  const int64_t bos = a.cu_seqlens[task.n];
  const int64_t eos = a.cu_seqlens[task.n + 1];
  int64_t snap = a.snapshot_cu != nullptr ? a.snapshot_cu[task.n] : 0;
  const int64_t snap_end = a.snapshot_cu != nullptr ? a.snapshot_cu[task.n + 1] : 0;
  SsdChunk chunks[kMaxSpanChunks];
  for (int64_t t0 = bos; t0 < eos;) {
    // The span: whole chunks, at most kSsdSpan tokens.
    int n = 0;
    int count = 0;
    while (t0 + n < eos && count < kMaxSpanChunks) {
      const int64_t start = t0 + n;
      int64_t end = eos - start < kSsdChunk ? eos : start + kSsdChunk;
      int64_t snapshot = -1;
      if (snap < snap_end && bos + a.snapshot_offsets[snap] <= end) {
        end = bos + a.snapshot_offsets[snap];
        snapshot = snap;
      }
      if (n + (end - start) > kSsdSpan) break;
      SsdChunk& c = chunks[count++];
      c.t0 = start;
      c.len = static_cast<int>(end - start);
      c.q = s.q + static_cast<size_t>(n) * kd;
      c.k = s.k + static_cast<size_t>(n) * kd;
      c.qk = s.qk + static_cast<size_t>(n) * kSsdChunk;
      c.snapshot = snapshot;
      if (snapshot >= 0) ++snap;
      n += c.len;
    }
    PrepareSpan<Vt>(task, kh, t0, n, chunks, count);
    for (int ci = 0; ci < count; ++ci) {
      const SsdChunk& c = chunks[ci];
      for (int g = 0; g < task.heads; ++g) {
        const int h = task.h + g;
        const internal::ChunkTask view = HeadView(task, g, kd, vp);
        const float* skip = a.options.D != nullptr ? a.options.D + h : nullptr;
        const float decay = PrepareHeadChunk<Vt>(task, h, c);
        for (int col = 0; col < vp; col += kB) {
          SsdBlock b;
          b.c0 = col;
          b.real = col >= a.V ? 0 : (a.V - col < kB ? a.V - col : kB);
          b.w = view.scratch.state + static_cast<size_t>(kd) * col;
          const int nv = (vp - col < kB ? vp - col : kB) / kL;
          if (nv == kChunkRegs) {
            BlockChunk<Vt, kChunkRegs>(task, h, c, b, decay, skip);
          } else if (nv == 1) {
            BlockChunk<Vt, 1>(task, h, c, b, decay, skip);
          } else if constexpr (kChunkRegs > 2) {
            if (nv == 2) {
              BlockChunk<Vt, 2>(task, h, c, b, decay, skip);
            } else {
              BlockChunk<Vt, 3>(task, h, c, b, decay, skip);
            }
          }
        }
        if (c.snapshot >= 0) {
          StoreState<Vt, kChunkRegs>(view, s.ones, {a.snapshot_states[c.snapshot], a.snapshot_dtype});
        }
      }
    }
    t0 += n;
  }
  if (task.final == nullptr) return;
  for (int g = 0; g < task.heads; ++g)
    StoreState<Vt, kChunkRegs>(HeadView(task, g, kd, vp), s.ones, {task.final, DType::kF32});
}

}  // namespace

void ChunkSsdTask(const internal::SsdTask& task) { RunSsdTask<Vec>(task); }

}  // namespace kda::KDA_TARGET_NS
