// Reference chunk_kda: the chunked (WY) algorithm of design §3, plain loops,
// fp32 arithmetic, one (sequence, value head) pair per task.
//
// Per chunk of C = 64 rows (restarting at each sequence start; the last may be
// partial), with S0 the state at the chunk start and Gamma_r = sum_{i<=r} g_i:
//   L[r,c] = beta_r sum_d k_r[d] k_c[d] e^{Gamma_r[d]-Gamma_c[d]}      (c < r)
//   A[r,c] = sum_d (scale q_r[d]) k_c[d] e^{Gamma_r[d]-Gamma_c[d]}    (c <= r)
//   u = (I+L)^-1 (beta v),  w = (I+L)^-1 (beta k e^{Gamma})          (forward substitution)
//   v_new = u - w S0
//   o_r = (scale q_r e^{Gamma_r})^T S0 + sum_{c<=r} A[r,c] v_new_c
//   S1 = diag(e^{Gamma_last}) S0 + sum_c (k_c e^{Gamma_last-Gamma_c}) v_new_c^T
// Without the delta correction (KdaOptions::delta_correction false) L = 0 and
// v_new = beta v: the chunked form of the plain gated linear recurrence.
//
// Numerics: g <= 0 is unbounded below (-250 per step occurs), so no factorised
// form (q e^{Gamma}, k e^{-Gamma}) is used. Every exponent is a sum of gates
// over a causal span (<= 0); anti-causal pairs are never formed. The span sums
// Gamma_r - Gamma_c and Gamma_last - Gamma_c are accumulated directly from the
// gates of the span instead of subtracting two cumulative sums: after a -250
// step the cumulative sums are large and their difference would lose the small
// decays that follow to cancellation.
//
// A scalar gate (GDN: g_t one value per value head) has one Gamma per row, so
// the decay leaves the dot products: L[r,c] = beta_r (k_r . k_c) e^{Gamma_r-Gamma_c}
// and A[r,c] = (scale q_r . k_c) e^{Gamma_r-Gamma_c}, plain products of the
// chunk's rows times a C x C decay mask (causal entries only). The gate is
// never broadcast over K: the per-dimension arrays below hold one value per
// row then (width 1, read at index 0 for every d).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/parallel.h"
#include "kda/kernels/chunk_kda_reference.h"
#include "kda/kernels/kda_args.h"
#include "kernels/kda/kda_common.h"

namespace kda {
namespace {

constexpr int kChunk = 64;

// Scratch of one worker, allocated before the parallel loop (nothing inside
// the loop allocates or throws).
struct ChunkWorkspace {
  ChunkWorkspace(int k_dim, int v_dim)
      : state(static_cast<size_t>(k_dim) * v_dim),
        q(static_cast<size_t>(kChunk) * k_dim),
        k(static_cast<size_t>(kChunk) * k_dim),
        g(static_cast<size_t>(kChunk) * k_dim),
        gamma(static_cast<size_t>(kChunk) * k_dim),
        w(static_cast<size_t>(kChunk) * k_dim),
        v(static_cast<size_t>(kChunk) * v_dim),
        u(static_cast<size_t>(kChunk) * v_dim),
        v_new(static_cast<size_t>(kChunk) * v_dim),
        beta(kChunk),
        l(static_cast<size_t>(kChunk) * kChunk),
        a(static_cast<size_t>(kChunk) * kChunk),
        span(k_dim),
        row(std::max(k_dim, v_dim)),
        snapshot(static_cast<size_t>(k_dim) * v_dim) {}

  std::vector<float> state;              // [K][V], the running state S
  std::vector<float> q, k, g, gamma, w;  // [C][K] (g and gamma: [C][gate width])
  std::vector<float> v, u, v_new;        // [C][V]
  std::vector<float> beta;               // [C]
  std::vector<float> l, a;               // [C][C], lower triangles used
  std::vector<float> span;               // [gate width], a running sum of gates over a span of rows
  std::vector<float> row;                // [max(K, V)], one output row
  std::vector<float> snapshot;           // [K][V], the state within a chunk
};

// Processes rows [t0, t0 + rows) of head h: the outputs, and what AdvanceState
// needs (ws.state, S0, is left as it is).
void ProcessChunk(const ChunkKdaArgs& a, int h, float scale, int64_t t0, int rows, ChunkWorkspace& ws) {
  const int k_dim = a.K;
  const int v_dim = a.V;
  const KdaOptions& opt = a.options;
  float* s = ws.state.data();
  // Gate rows are gw wide; dimension d of a row reads element d * gs (a scalar gate: element 0).
  const int gw = internal::GateWidth(a);
  const int gs = a.scalar_gate ? 0 : 1;

  const int kh = internal::KeyHeadOf(h, a.H, a.HV);
  for (int r = 0; r < rows; ++r) {
    const int64_t t = t0 + r;
    const auto value_row = static_cast<size_t>(t * a.HV + h);
    internal::LoadQ(a.q, internal::QOffset(a, t, kh), k_dim, opt, scale, &ws.q[static_cast<size_t>(r) * k_dim]);
    internal::LoadK(a.k, internal::KOffset(a, t, kh), k_dim, opt, &ws.k[static_cast<size_t>(r) * k_dim]);
    internal::LoadRow(a.v, internal::VOffset(a, t, h), v_dim, &ws.v[static_cast<size_t>(r) * v_dim]);
    internal::LoadGate(a.g, t, h, a.HV, gw, opt, &ws.g[static_cast<size_t>(r) * gw]);
    ws.beta[r] = internal::LoadBeta(a.beta, value_row, opt);
  }

  // Gamma: inclusive prefix sums from the chunk start (gates of one sign: no cancellation).
  for (int d = 0; d < gw; ++d) {
    float acc = 0.0F;
    for (int r = 0; r < rows; ++r) {
      acc += ws.g[static_cast<size_t>(r) * gw + d];
      ws.gamma[static_cast<size_t>(r) * gw + d] = acc;
    }
  }

  // L (strictly lower) and A (lower with diagonal). Only causal pairs c <= r are formed.
  for (int r = 0; r < rows; ++r) {
    const float* q_r = &ws.q[static_cast<size_t>(r) * k_dim];
    const float* k_r = &ws.k[static_cast<size_t>(r) * k_dim];
    float diag = 0.0F;  // exponent 0 on the diagonal
    for (int d = 0; d < k_dim; ++d) diag += q_r[d] * k_r[d];
    ws.a[static_cast<size_t>(r) * kChunk + r] = diag;
    // span[d] = Gamma_r[d] - Gamma_c[d] = sum_{i=c+1..r} g_i[d] <= 0, grown as c walks back from r.
    std::fill(ws.span.begin(), ws.span.end(), 0.0F);
    for (int c = r - 1; c >= 0; --c) {
      const float* g_next = &ws.g[static_cast<size_t>(c + 1) * gw];
      const float* k_c = &ws.k[static_cast<size_t>(c) * k_dim];
      float kk = 0.0F;
      float qk = 0.0F;
      if (a.scalar_gate) {  // the plain products times the mask entry e^{Gamma_r - Gamma_c}
        ws.span[0] += g_next[0];
        for (int d = 0; d < k_dim; ++d) {
          kk += k_r[d] * k_c[d];
          qk += q_r[d] * k_c[d];
        }
        const float decay = std::exp(ws.span[0]);
        kk *= decay;
        qk *= decay;
      } else {
        for (int d = 0; d < k_dim; ++d) {
          ws.span[d] += g_next[d];
          const float decay = std::exp(ws.span[d]);
          kk += k_r[d] * k_c[d] * decay;
          qk += q_r[d] * k_c[d] * decay;
        }
      }
      ws.l[static_cast<size_t>(r) * kChunk + c] = opt.delta_correction ? ws.beta[r] * kk : 0.0F;
      ws.a[static_cast<size_t>(r) * kChunk + c] = qk;
    }
  }

  // Forward substitution with the unit lower triangular (I + L):
  //   u_r = beta_r v_r - sum_{c<r} L[r,c] u_c,   w_r = beta_r k_r e^{Gamma_r} - sum_{c<r} L[r,c] w_c.
  // |L[r,c]| <= 1 for normalised k and beta <= 1, so this is well conditioned in fp32.
  for (int r = 0; r < rows; ++r) {
    float* u_r = &ws.u[static_cast<size_t>(r) * v_dim];
    float* w_r = &ws.w[static_cast<size_t>(r) * k_dim];
    const float* v_r = &ws.v[static_cast<size_t>(r) * v_dim];
    const float* k_r = &ws.k[static_cast<size_t>(r) * k_dim];
    const float* gamma_r = &ws.gamma[static_cast<size_t>(r) * gw];
    for (int j = 0; j < v_dim; ++j) u_r[j] = ws.beta[r] * v_r[j];
    for (int d = 0; d < k_dim; ++d) w_r[d] = ws.beta[r] * k_r[d] * std::exp(gamma_r[d * gs]);
    for (int c = 0; c < r; ++c) {
      const float l_rc = ws.l[static_cast<size_t>(r) * kChunk + c];
      const float* u_c = &ws.u[static_cast<size_t>(c) * v_dim];
      const float* w_c = &ws.w[static_cast<size_t>(c) * k_dim];
      for (int j = 0; j < v_dim; ++j) u_r[j] -= l_rc * u_c[j];
      for (int d = 0; d < k_dim; ++d) w_r[d] -= l_rc * w_c[d];
    }
  }

  // v_new = u - w S0 (without the delta correction: u).
  for (int r = 0; r < rows; ++r) {
    float* vn_r = &ws.v_new[static_cast<size_t>(r) * v_dim];
    const float* u_r = &ws.u[static_cast<size_t>(r) * v_dim];
    const float* w_r = &ws.w[static_cast<size_t>(r) * k_dim];
    for (int j = 0; j < v_dim; ++j) vn_r[j] = u_r[j];
    for (int d = 0; d < k_dim && opt.delta_correction; ++d) {
      const float* s_d = s + static_cast<size_t>(d) * v_dim;
      for (int j = 0; j < v_dim; ++j) vn_r[j] -= w_r[d] * s_d[j];
    }
  }

  // o_r = (scale q_r e^{Gamma_r})^T S0 + sum_{c<=r} A[r,c] v_new_c.
  float* o_row = ws.row.data();
  for (int r = 0; r < rows; ++r) {
    const float* q_r = &ws.q[static_cast<size_t>(r) * k_dim];
    const float* gamma_r = &ws.gamma[static_cast<size_t>(r) * gw];
    std::fill(o_row, o_row + v_dim, 0.0F);
    for (int d = 0; d < k_dim; ++d) {
      const float qe = q_r[d] * std::exp(gamma_r[d * gs]);
      const float* s_d = s + static_cast<size_t>(d) * v_dim;
      for (int j = 0; j < v_dim; ++j) o_row[j] += qe * s_d[j];
    }
    for (int c = 0; c <= r; ++c) {
      const float a_rc = ws.a[static_cast<size_t>(r) * kChunk + c];
      const float* vn_c = &ws.v_new[static_cast<size_t>(c) * v_dim];
      for (int j = 0; j < v_dim; ++j) o_row[j] += a_rc * vn_c[j];
    }
    if (opt.D != nullptr) {  // Mamba2's skip: o + D v (ws.v holds v as read)
      const float* v_r = &ws.v[static_cast<size_t>(r) * v_dim];
      for (int j = 0; j < v_dim; ++j) o_row[j] += opt.D[h] * v_r[j];
    }
    const size_t out_base = static_cast<size_t>((t0 + r) * a.HV + h) * static_cast<size_t>(v_dim);
    for (int j = 0; j < v_dim; ++j) StoreFromFloat(a.o.data, a.o.dtype, out_base + j, o_row[j]);
  }
}

// The state after row `last` of the chunk ProcessChunk processed, in place on
// s, which holds S0 (ws.state for the chunk's end; a copy for a snapshot
// within it):
//   S = diag(e^{Gamma_last}) S0 + sum_{c <= last} (k_c e^{Gamma_last - Gamma_c}) v_new_c^T.
void AdvanceState(const ChunkKdaArgs& a, int last, ChunkWorkspace& ws, float* s) {
  const int k_dim = a.K;
  const int v_dim = a.V;
  const int gw = internal::GateWidth(a);
  const int gs = a.scalar_gate ? 0 : 1;
  const float* gamma_last = &ws.gamma[static_cast<size_t>(last) * gw];
  for (int d = 0; d < k_dim; ++d) {
    const float decay = std::exp(gamma_last[d * gs]);
    float* s_d = s + static_cast<size_t>(d) * v_dim;
    for (int j = 0; j < v_dim; ++j) s_d[j] *= decay;
  }
  // span[d] = Gamma_last[d] - Gamma_c[d] = sum_{i=c+1..last} g_i[d], grown as c walks back from last.
  std::fill(ws.span.begin(), ws.span.end(), 0.0F);
  for (int c = last; c >= 0; --c) {
    const float* k_c = &ws.k[static_cast<size_t>(c) * k_dim];
    const float* vn_c = &ws.v_new[static_cast<size_t>(c) * v_dim];
    for (int d = 0; d < k_dim; ++d) {
      const float kd = k_c[d] * std::exp(ws.span[d * gs]);
      float* s_d = s + static_cast<size_t>(d) * v_dim;
      for (int j = 0; j < v_dim; ++j) s_d[j] += kd * vn_c[j];
    }
    const float* g_c = &ws.g[static_cast<size_t>(c) * gw];
    for (int d = 0; d < gw; ++d) ws.span[d] += g_c[d];
  }
}

// One (sequence n, head h) task: load the initial state, run the chunks, store the final state.
void RunSequenceHead(const ChunkKdaArgs& a, int64_t n, int h, float scale, ChunkWorkspace& ws) {
  const size_t state_size = static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
  const size_t head_off = static_cast<size_t>(h) * state_size;
  const int64_t bos = a.cu_seqlens[n];
  const int64_t eos = a.cu_seqlens[n + 1];

  if (internal::IsPaddingSequence(a, n)) {  // zero outputs, no state read or written
    for (int64_t t = bos; t < eos; ++t) {
      const size_t out_base = static_cast<size_t>(t * a.HV + h) * static_cast<size_t>(a.V);
      for (int j = 0; j < a.V; ++j) StoreFromFloat(a.o.data, a.o.dtype, out_base + j, 0.0F);
    }
    return;
  }
  const float* initial = internal::SequenceInitialState(a, n);
  float* final_state = internal::SequenceFinalState(a, n);

  // The whole state is read here, before anything is written: the initial state may alias the final one.
  if (initial != nullptr) {
    internal::LoadHeadState(initial + head_off, a.K, a.V, a.state_v_first, ws.state.data());
  } else {
    std::fill(ws.state.begin(), ws.state.end(), 0.0F);
  }

  // Snapshots within a chunk are formed from its S0 without changing the chunks (nor the results' bits).
  int64_t snap = a.snapshot_cu != nullptr ? a.snapshot_cu[n] : 0;
  const int64_t snap_end = a.snapshot_cu != nullptr ? a.snapshot_cu[n + 1] : 0;
  const auto snapshot = [&](int64_t j) { return MutBuf{a.snapshot_states[j], a.snapshot_dtype}; };
  for (int64_t t0 = bos; t0 < eos; t0 += kChunk) {
    const int rows = static_cast<int>(std::min<int64_t>(kChunk, eos - t0));
    ProcessChunk(a, h, scale, t0, rows, ws);
    for (; snap < snap_end && a.snapshot_offsets[snap] < t0 + rows - bos; ++snap) {
      std::copy(ws.state.begin(), ws.state.end(), ws.snapshot.begin());
      AdvanceState(a, static_cast<int>(bos + a.snapshot_offsets[snap] - t0) - 1, ws, ws.snapshot.data());
      internal::StoreHeadState(ws.snapshot.data(), a.K, a.V, a.state_v_first, snapshot(snap), head_off);
    }
    AdvanceState(a, rows - 1, ws, ws.state.data());
    if (snap < snap_end && a.snapshot_offsets[snap] == t0 + rows - bos) {
      internal::StoreHeadState(ws.state.data(), a.K, a.V, a.state_v_first, snapshot(snap), head_off);
      ++snap;
    }
  }

  if (final_state == nullptr) return;
  // A zero-length sequence's final state is its initial state: with aliasing there is nothing to write.
  if (bos == eos && initial == final_state) return;
  internal::StoreHeadState(ws.state.data(), a.K, a.V, a.state_v_first, {final_state, DType::kF32}, head_off);
}

}  // namespace

namespace internal {

void ChunkKdaReferenceUnchecked(const ChunkKdaArgs& a) {
  if (a.intermediate_states.data != nullptr) {
    RunWithIntermediateStates(a, [](const ChunkKdaArgs& b) { ChunkKdaReferenceUnchecked(b); });
    return;
  }
  const float scale = EffectiveScale(a.options, a.K);
  const int64_t num_tasks = a.N * a.HV;
  const int64_t num_workers = std::max<int64_t>(1, std::min<int64_t>(NumThreads(), num_tasks));
  std::vector<ChunkWorkspace> workspaces;
  workspaces.reserve(static_cast<size_t>(num_workers));
  for (int64_t i = 0; i < num_workers; ++i) workspaces.emplace_back(a.K, a.V);

  // Each worker takes (n, h) tasks from a shared counter and uses its own workspace.
  std::atomic<int64_t> next_task{0};
  ParallelFor(num_workers, [&](int64_t worker) {
    ChunkWorkspace& ws = workspaces[static_cast<size_t>(worker)];
    for (int64_t task = next_task.fetch_add(1); task < num_tasks; task = next_task.fetch_add(1)) {
      RunSequenceHead(a, task / a.HV, static_cast<int>(task % a.HV), scale, ws);
    }
  });
}

}  // namespace internal

void chunk_kda_reference(const ChunkKdaArgs& a) {
  ValidateChunkKda(a);
  internal::ChunkKdaReferenceUnchecked(a);
}

}  // namespace kda
