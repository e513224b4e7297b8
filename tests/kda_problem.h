// Random KDA kernel problems shared by the kernel tests: packed varlen
// batches with ragged lengths, mild, loud (down to -60 per step) or stress
// gates (down to -250 per step), a gate per key dimension (KDA) or one per
// value head (GDN),
// optional initial states and in-kernel norm/gate options, stored as F32 or
// BF16 on demand.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/base/f16.h"
#include "kda/kernels/kda_args.h"
#include "tests/tolerance.h"

namespace kda::testing {

// Fills outputs and the dummy state slot, so untouched entries are visible.
constexpr float kSentinel = -12345.0F;

// ---------------------------------------------------------------- problems

// kLoud: trained-like GDN gates (as the gdn-loud golden set: median about -8.7, down to -60 per step).
enum class GateKind { kMild, kStress, kNone, kLoud };

struct Spec {
  std::vector<int64_t> lengths;
  int H = 2;
  int K = 64;
  GateKind gate = GateKind::kMild;
  bool l2norm_in_kernel = false;
  bool gate_in_kernel = false;
  bool initial_state = true;
  float scale = 0.0F;
  uint32_t seed = 1;
  // fla's options (defaults: Kimi-Linear's configuration).
  int HV = 0;                 // value heads, a multiple of H (0: H)
  int V = 0;                  // value head dim (0: K)
  bool beta_sigmoid = false;  // beta holds logits (use_beta_sigmoid_in_kernel)
  bool allow_neg_eigval = false;
  float lower_bound = 0.0F;      // < 0: fla's sigmoid gate with gate_in_kernel
  bool no_a_log = false;         // the sigmoid gate without A_log
  bool beta_per_value = false;   // beta [T, HV, V] (fused_recurrent_kda only)
  bool state_v_first = false;    // states [.., HV, V, K]
  bool scalar_gate = false;      // g [T, HV]: one decay per value head (GDN); else [T, HV, K]
  bool delta_correction = true;  // false: S += beta k v^T (Mamba2's SSD recurrence)
  bool skip = false;             // Mamba2's skip D [HV] (without the delta correction): o + D v
};

// A problem: the spec it was drawn from (HV and V resolved: never 0; its
// options are the kernel call's), its sizes and its inputs as fp32 values
// (q/k/v/g/beta may be stored as BF16 later).
struct Problem : Spec {
  int64_t T = 0;
  int64_t N = 0;
  std::vector<int64_t> cu;            // [N + 1]
  std::vector<float> q, k;            // [T, H, K]
  std::vector<float> v;               // [T, HV, V]
  std::vector<float> g;               // [T, HV, K] ([T, HV] with scalar_gate; raw with gate_in_kernel)
  std::vector<float> beta;            // [T, HV] ([T, HV, V] with beta_per_value; logits with beta_sigmoid)
  std::vector<float> h0;              // [N, HV, K, V] (V-first with state_v_first), empty for zeros
  std::vector<float> a_log, dt_bias;  // [HV] (empty with no_a_log), [HV*K] ([HV]) with gate_in_kernel
  std::vector<float> d;               // [HV] with skip, else empty

  size_t HeadState() const { return static_cast<size_t>(K) * V; }
  size_t StateSize() const { return static_cast<size_t>(N) * HV * HeadState(); }
  size_t KeyRow() const { return static_cast<size_t>(H) * K; }              // q, k of one token
  int GateWidth() const { return scalar_gate ? 1 : K; }                     // g of one value head and token
  size_t GateRow() const { return static_cast<size_t>(HV) * GateWidth(); }  // g of one token
  size_t ValueRow() const { return static_cast<size_t>(HV) * V; }           // v, o of one token
  size_t BetaRow() const { return beta_per_value ? ValueRow() : static_cast<size_t>(HV); }
};

inline void NormalizeRows(std::vector<float>& x, int len) {
  for (size_t base = 0; base < x.size(); base += len) {
    double ss = 0.0;
    for (int d = 0; d < len; ++d) ss += static_cast<double>(x[base + d]) * x[base + d];
    const double inv = 1.0 / std::sqrt(ss + 1e-6);
    for (int d = 0; d < len; ++d) x[base + d] = static_cast<float>(x[base + d] * inv);
  }
}

inline Problem MakeProblem(const Spec& s) {
  Problem p;
  static_cast<Spec&>(p) = s;
  p.HV = s.HV > 0 ? s.HV : s.H;
  p.V = s.V > 0 ? s.V : s.K;
  p.N = static_cast<int64_t>(s.lengths.size());
  p.cu.push_back(0);
  for (int64_t len : s.lengths) p.cu.push_back(p.cu.back() + len);
  p.T = p.cu.back();

  std::mt19937 rng(s.seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::uniform_real_distribution<float> uniform(0.0F, 1.0F);
  const size_t n_qk = static_cast<size_t>(p.T) * p.KeyRow();
  auto fill = [&](std::vector<float>& x, size_t n, float mul) {
    x.resize(n);
    for (float& e : x) e = mul * normal(rng);
  };
  fill(p.q, n_qk, s.l2norm_in_kernel ? 3.0F : 1.0F);
  fill(p.k, n_qk, s.l2norm_in_kernel ? 3.0F : 1.0F);
  if (!s.l2norm_in_kernel) {  // the delta rule needs |k| <= 1 (and fp32 sums of unit rows stay well conditioned)
    NormalizeRows(p.q, p.K);
    NormalizeRows(p.k, p.K);
  }
  fill(p.v, static_cast<size_t>(p.T) * p.ValueRow(), 1.0F);
  p.beta.resize(static_cast<size_t>(p.T) * p.BetaRow());
  // beta in [0, 1] (with allow_neg_eigval in [0, 2)), as stored or as its logit.
  for (float& b : p.beta) b = s.beta_sigmoid ? 1.5F * normal(rng) : 1.0F / (1.0F + std::exp(-normal(rng)));
  // Without the delta correction (Mamba2: beta = dt): dt in [0, 4).
  if (!s.delta_correction && !s.beta_sigmoid) {
    for (float& b : p.beta) b = 4.0F * uniform(rng);
  }

  p.g.resize(static_cast<size_t>(p.T) * p.GateRow());
  if (s.gate_in_kernel) {
    if (!s.no_a_log) {
      p.a_log.resize(p.HV);
      for (float& a : p.a_log) a = std::log(1.0F + 9.0F * uniform(rng));
    }
    fill(p.dt_bias, p.GateRow(), 0.5F);
    for (float& x : p.g) {
      const float u = uniform(rng);
      if (s.gate == GateKind::kStress && u < 0.05F) {
        x = 20.0F + 5.0F * uniform(rng);  // the linear branch of softplus: g down to -250
      } else if (s.gate == GateKind::kLoud && u < 0.6F) {
        x = 1.0F + 4.0F * uniform(rng);  // with A in [1, 10] (a_log below): g down to about -50
      } else if ((s.gate == GateKind::kStress || s.gate == GateKind::kLoud) && u < 0.25F) {
        x = normal(rng);
      } else {
        x = -6.0F + normal(rng);
      }
    }
  } else if (s.gate == GateKind::kNone) {
    std::fill(p.g.begin(), p.g.end(), 0.0F);
  } else {
    for (float& x : p.g) {
      const float u = uniform(rng);
      if (s.gate == GateKind::kMild) {
        x = -std::exp(-3.5F + normal(rng));
      } else if (s.gate == GateKind::kLoud) {
        // Log-uniform over [0.001, 60]: median about -0.25, a fifth below -8.7, down to -60.
        x = u < 0.6F ? -std::exp(std::log(0.001F) + std::log(60000.0F) * uniform(rng)) : -60.0F * uniform(rng);
      } else if (u < 0.05F) {
        x = -250.0F;
      } else if (u < 0.10F) {
        x = -250.0F * uniform(rng);
      } else if (u < 0.25F) {
        x = -5.0F * uniform(rng);
      } else if (u < 0.30F) {
        x = 0.0F;
      } else {
        x = -0.01F * uniform(rng);
      }
    }
  }
  if (s.initial_state) fill(p.h0, p.StateSize(), 0.5F);
  if (s.skip) fill(p.d, static_cast<size_t>(p.HV), 1.0F);  // drawn last: the other inputs as without it
  return p;
}

// x rounded once to dt (F32: x itself), as fp32.
inline float RoundedOnce(DType dt, float x) {
  if (dt == DType::kBF16) return RoundBF16(x);
  if (dt == DType::kF16) return RoundF16(x);
  return x;
}

// q, k, v, g and beta rounded to dt's values (F32: unchanged).
inline void RoundInputsTo(Problem& p, DType dt) {
  for (std::vector<float>* x : {&p.q, &p.k, &p.v, &p.g, &p.beta}) {
    for (float& e : *x) e = RoundedOnce(dt, e);
  }
}

// A float-valued buffer stored as F32, BF16 or F16.
class Typed {
 public:
  Typed(const std::vector<float>& x, DType t) : dtype_(t), n_(x.size()) {
    bytes_.resize(x.size() * DTypeSize(t) + 1);
    for (size_t i = 0; i < x.size(); ++i) StoreFromFloat(bytes_.data(), t, i, x[i]);
  }
  Typed(size_t n, DType t, float value) : Typed(std::vector<float>(n, value), t) {}

  MutBuf Mut() { return {bytes_.data(), dtype_}; }
  TensorView View(std::initializer_list<int64_t> shape) const { return ContiguousView(Data(), dtype_, shape); }
  std::vector<float> ToF32() const {
    std::vector<float> r(n_);
    for (size_t i = 0; i < n_; ++i) r[i] = LoadAsFloat(bytes_.data(), dtype_, i);
    return r;
  }

 private:
  const void* Data() const { return bytes_.data(); }
  DType dtype_;
  size_t n_;
  // Storage of any element type (operator new aligns it for floats).
  std::vector<uint8_t> bytes_;
};

struct Result {
  std::vector<float> o;      // [T, HV, V]
  std::vector<float> state;  // [N, HV, K, V] (V-first with state_v_first)
};

// Token inputs as kernel buffers: q, k, v in qkv, g and beta in gb.
struct TypedInputs {
  TypedInputs(const std::vector<float>& q_, const std::vector<float>& k_, const std::vector<float>& v_,
              const std::vector<float>& g_, const std::vector<float>& beta_, DType qkv, DType gb)
      : q(q_, qkv), k(k_, qkv), v(v_, qkv), g(g_, gb), beta(beta_, gb) {}
  // A problem's tokens.
  TypedInputs(const Problem& p, DType qkv, DType gb) : TypedInputs(p.q, p.k, p.v, p.g, p.beta, qkv, gb) {}
  Typed q, k, v, g, beta;
};

// p's options on a call, in fla's names (p.scale <= 0: the default K^-0.5).
inline void SetOptions(const Problem& p, KdaCallCommon& c) {
  if (p.scale > 0) c.scale = p.scale;
  c.use_qk_l2norm_in_kernel = p.l2norm_in_kernel;
  c.use_gate_in_kernel = p.gate_in_kernel;
  c.use_beta_sigmoid_in_kernel = p.beta_sigmoid;
  c.allow_neg_eigval = p.allow_neg_eigval;
  c.state_v_first = p.state_v_first;
  if (!p.delta_correction) c.delta_correction = false;  // Mamba2's recurrence
  if (!p.d.empty()) c.D = ContiguousView<const void*>(p.d.data(), DType::kF32, {p.HV});
  if (p.gate_in_kernel) {
    if (!p.a_log.empty()) c.A_log = ContiguousView<const void*>(p.a_log.data(), DType::kF32, {p.HV});
    c.dt_bias = ContiguousView<const void*>(p.dt_bias.data(), DType::kF32, {static_cast<int64_t>(p.GateRow())});
    if (p.lower_bound < 0.0F) c.lower_bound = p.lower_bound;
  }
}

// A call of p's head shape and options over the tokens in `in` (which must
// outlive it), `rows` batch rows of `t` tokens each ([1, T, ...] packed,
// [N, 1, ...] decode), writing o; the sequences and states are the caller's.
template <class Call>
Call TokenCall(const Problem& p, const TypedInputs& in, MutBuf o, int64_t rows, int64_t t) {
  Call c;
  c.o = ContiguousView<void*>(o.data, o.dtype, {rows, t, p.HV, p.V});
  c.q = in.q.View({rows, t, p.H, p.K});
  c.k = in.k.View({rows, t, p.H, p.K});
  c.v = in.v.View({rows, t, p.HV, p.V});
  c.g = p.scalar_gate ? in.g.View({rows, t, p.HV}) : in.g.View({rows, t, p.HV, p.K});
  c.beta = p.beta_per_value ? in.beta.View({rows, t, p.HV, p.V}) : in.beta.View({rows, t, p.HV});
  SetOptions(p, c);
  return c;
}

// [n, HV, K, V] fp32 states of p's head shape ([n, HV, V, K] with state_v_first).
inline TensorView StatesView(const Problem& p, const float* data, int64_t n) {
  return p.state_v_first ? ContiguousView<const void*>(data, DType::kF32, {n, p.HV, p.V, p.K})
                         : ContiguousView<const void*>(data, DType::kF32, {n, p.HV, p.K, p.V});
}
inline MutTensorView MutStatesView(const Problem& p, float* data, int64_t n) {
  return p.state_v_first ? ContiguousView<void*>(data, DType::kF32, {n, p.HV, p.V, p.K})
                         : ContiguousView<void*>(data, DType::kF32, {n, p.HV, p.K, p.V});
}

// A decode call for p's head shape and options: token n of `in` ([N, 1, ...],
// N = idx.size()) updates states[idx[n]] of a pool of num_states, writing o.
inline RecurrentKdaCall DecodeCallFor(const Problem& p, const TypedInputs& in, MutBuf o, float* states,
                                      int64_t num_states, const std::vector<int32_t>& idx) {
  const auto n = static_cast<int64_t>(idx.size());
  RecurrentKdaCall c = TokenCall<RecurrentKdaCall>(p, in, o, n, 1);
  c.initial_state = MutStatesView(p, states, num_states);
  c.ssm_state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {n});
  return c;
}

// q, k and v of a call as an engine passes them: the column slices of one
// fused projection [rows * t, s] (q's H * K columns, k's, v's HV * V, then
// `pad` more), read in place through token strides [t * s, s, dim, 1]. The
// call's q, k, v views (contiguous, one dtype) are copied in, then point into
// the buffer, which holds exactly what the views reach.
class FusedQkv {
 public:
  FusedQkv(KdaCallCommon& c, int64_t pad) {
    TensorView* views[] = {&c.q, &c.k, &c.v};
    const int64_t rows = c.q.shape[0];
    const int64_t t = c.q.shape[1];
    const int64_t tokens = rows * t;
    int64_t s = pad;
    for (const TensorView* v : views) s += v->shape[2] * v->shape[3];
    const size_t es = DTypeSize(c.q.dtype);
    bytes_.assign(tokens == 0 ? 0 : static_cast<size_t>((tokens - 1) * s + (s - pad)) * es, 0);
    int64_t column = 0;
    for (TensorView* v : views) {
      const int64_t row = v->shape[2] * v->shape[3];
      for (int64_t i = 0; i < tokens; ++i) {
        std::memcpy(bytes_.data() + static_cast<size_t>(i * s + column) * es,
                    static_cast<const uint8_t*>(v->data) + static_cast<size_t>(i * row) * es,
                    static_cast<size_t>(row) * es);
      }
      v->data = bytes_.data() + static_cast<size_t>(column) * es;
      v->strided = true;
      const int64_t strides[] = {t * s, s, v->shape[3], 1};
      std::copy(std::begin(strides), std::end(strides), v->strides);
      column += row;
    }
  }
  FusedQkv(const FusedQkv&) = delete;
  FusedQkv& operator=(const FusedQkv&) = delete;

 private:
  std::vector<uint8_t> bytes_;
};

// A call whose f32 token views (q, k, v, g [rows, t, H, K], beta [rows, t, H])
// have no data: a shape-only call, or an empty batch's. o stays absent.
template <class Call>
Call NullTokenCall(int64_t rows, int64_t t, int64_t h, int64_t k) {
  Call c;
  c.q = c.k = c.v = c.g = ContiguousView<const void*>(nullptr, DType::kF32, {rows, t, h, k});
  c.beta = ContiguousView<const void*>(nullptr, DType::kF32, {rows, t, h});
  return c;
}

// The packed batch through a one-token decode kernel, token by token: step t
// takes token t of every sequence still running (state slot n + 1; shorter
// sequences are padding entries, slot 0 holds a sentinel state).
// fused_pad >= 0: q, k, v as slices of a fused projection (FusedQkv) with that pad.
inline Result RunTokenByToken(const Problem& p, void (*decode)(const RecurrentKdaArgs&), DType qkv = DType::kF32,
                              DType gb = DType::kF32, int64_t fused_pad = -1) {
  const size_t per_state = static_cast<size_t>(p.HV) * p.HeadState();
  const size_t key = p.KeyRow(), gate = p.GateRow(), value = p.ValueRow(), br = p.BetaRow();
  std::vector<float> states((p.N + 1) * per_state, 0.0F);
  for (size_t i = 0; i < per_state; ++i) states[i] = kSentinel;
  if (!p.h0.empty()) std::copy(p.h0.begin(), p.h0.end(), states.begin() + static_cast<std::ptrdiff_t>(per_state));

  Result r;
  r.o.assign(static_cast<size_t>(p.T) * value, kSentinel);
  int64_t max_len = 0;
  for (int64_t n = 0; n < p.N; ++n) max_len = std::max(max_len, p.cu[n + 1] - p.cu[n]);
  for (int64_t t = 0; t < max_len; ++t) {
    std::vector<float> q(p.N * key, 0.0F), k(p.N * key, 0.0F), v(p.N * value, 0.0F), g(p.N * gate, 0.0F);
    std::vector<float> beta(p.N * br, 0.0F);
    std::vector<int32_t> idx(p.N, -1);
    for (int64_t n = 0; n < p.N; ++n) {
      if (t >= p.cu[n + 1] - p.cu[n]) continue;
      const size_t tok = static_cast<size_t>(p.cu[n] + t);
      idx[n] = static_cast<int32_t>(n + 1);
      std::copy_n(p.q.begin() + tok * key, key, q.begin() + n * key);
      std::copy_n(p.k.begin() + tok * key, key, k.begin() + n * key);
      std::copy_n(p.v.begin() + tok * value, value, v.begin() + n * value);
      std::copy_n(p.g.begin() + tok * gate, gate, g.begin() + n * gate);
      std::copy_n(p.beta.begin() + tok * br, br, beta.begin() + n * br);
    }
    const TypedInputs in(q, k, v, g, beta, qkv, gb);
    Typed o(v.size(), qkv, kSentinel);
    RecurrentKdaCall c = DecodeCallFor(p, in, o.Mut(), states.data(), p.N + 1, idx);
    std::optional<FusedQkv> fused;
    if (fused_pad >= 0) fused.emplace(c, fused_pad);
    decode(BindRecurrentKda(c));
    const std::vector<float> of = o.ToF32();
    for (int64_t n = 0; n < p.N; ++n) {
      if (idx[n] < 0) {
        for (size_t i = 0; i < value; ++i) EXPECT_EQ(of[n * value + i], 0.0F) << "padding output not zero";
        continue;
      }
      std::copy_n(of.begin() + n * value, value, r.o.begin() + (p.cu[n] + t) * value);
    }
  }
  for (size_t i = 0; i < per_state; ++i) EXPECT_EQ(states[i], kSentinel) << "slot 0 touched";
  r.state.assign(states.begin() + static_cast<std::ptrdiff_t>(per_state), states.end());
  return r;
}

// ------------------------------------------------------- chunk runs, checks

// How RunChunkWith calls the prefill kernel.
struct ChunkRun {
  DType qkv = DType::kF32;  // q, k, v and o
  DType gb = DType::kF32;   // g and beta
  bool alias = false;       // the initial state buffer is also the final one
  bool output_final_state = true;
  // The output starts this many elements past a 64-byte boundary. At 0 the
  // optimized kernel streams its output rows (non-temporal stores); off
  // alignment it stores them plainly.
  int out_shift = 0;
  int64_t fused_pad = -1;  // >= 0: q, k, v as slices of a fused projection (FusedQkv) with this pad
};

// A [n] output of dtype t filled with kSentinel, starting `shift` elements
// past a 64-byte boundary.
class ShiftedOut {
 public:
  ShiftedOut(size_t n, DType t, int shift) : dtype_(t), n_(n) {
    const size_t esize = DTypeSize(t);
    storage_.resize((n + static_cast<size_t>(shift)) * esize + 64);
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - base % 64) % 64) + static_cast<size_t>(shift) * esize;
    for (size_t i = 0; i < n; ++i) StoreFromFloat(data_, t, i, kSentinel);
  }
  MutBuf Mut() { return {data_, dtype_}; }
  std::vector<float> ToF32() const {
    std::vector<float> r(n_);
    for (size_t i = 0; i < n_; ++i) r[i] = LoadAsFloat(data_, dtype_, i);
    return r;
  }

 private:
  DType dtype_;
  size_t n_;
  std::vector<uint8_t> storage_;
  uint8_t* data_ = nullptr;
};

// A chunk_kda call for p's packed batch over `in` (which must outlive it),
// writing o: tokens [1, T, ...], p.cu as the int64 cu_seqlens, p's options;
// the states (contiguous or pool form) are the caller's to set.
inline ChunkKdaCall ChunkCallFor(const Problem& p, const TypedInputs& in, MutBuf o) {
  ChunkKdaCall c = TokenCall<ChunkKdaCall>(p, in, o, 1, p.T);
  c.cu_seqlens = ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1});
  return c;
}

// The contiguous state form on c: `initial` [N, HV, K, V] (null: zeros) and,
// unless null, `final_state` [N, HV, K, V] written (output_final_state).
inline void SetStates(const Problem& p, ChunkKdaCall& c, const float* initial, float* final_state) {
  c.initial_state = initial != nullptr ? StatesView(p, initial, p.N) : TensorView{};
  c.output_final_state = final_state != nullptr;
  c.final_state = final_state != nullptr ? MutStatesView(p, final_state, p.N) : MutTensorView{};
}

// A chunk_kda implementation over the whole packed batch (the call bound by BindChunkKda).
inline Result RunChunkWith(const Problem& p, void (*chunk)(const ChunkKdaArgs&), const ChunkRun& run = {}) {
  const TypedInputs in(p, run.qkv, run.gb);
  ShiftedOut o(static_cast<size_t>(p.T) * p.ValueRow(), run.qkv, run.out_shift);
  std::vector<float> state = run.alias && !p.h0.empty() ? p.h0 : std::vector<float>(p.StateSize(), kSentinel);
  ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
  const float* initial = p.h0.empty() ? nullptr : (run.alias ? state.data() : p.h0.data());
  SetStates(p, c, initial, run.output_final_state ? state.data() : nullptr);
  std::optional<FusedQkv> fused;
  if (run.fused_pad >= 0) fused.emplace(c, run.fused_pad);
  chunk(BindChunkKda(c));
  return {o.ToF32(), state};
}

inline ::testing::AssertionResult AllFinite(const std::vector<float>& x) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return ::testing::AssertionFailure() << "element " << i << " is " << x[i];
  }
  return ::testing::AssertionSuccess();
}

// Bit-for-bit equality of two float arrays (unlike ==, tells -0 from 0 and compares NaNs).
// Empty arrays are equal, whatever their pointers (an empty vector's may be null).
inline bool BitEqual(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Outputs and final states finite and within the fp32 tolerance.
inline void ExpectClose(const Result& got, const Result& want) {
  ASSERT_EQ(got.o.size(), want.o.size());
  ASSERT_EQ(got.state.size(), want.state.size());
  EXPECT_TRUE(AllFinite(got.o));
  EXPECT_TRUE(AllFinite(got.state));
  EXPECT_TRUE(AllCloseF32(got.o.data(), want.o.data(), got.o.size())) << "outputs";
  EXPECT_TRUE(AllCloseF32(got.state.data(), want.state.data(), got.state.size())) << "final states";
}

inline void ExpectBitEqual(const Result& got, const Result& want) {
  ASSERT_EQ(got.o.size(), want.o.size());
  ASSERT_EQ(got.state.size(), want.state.size());
  EXPECT_TRUE(BitEqual(got.o.data(), want.o.data(), got.o.size())) << "outputs";
  EXPECT_TRUE(BitEqual(got.state.data(), want.state.data(), got.state.size())) << "final states";
}

// The spec in a line, for SCOPED_TRACE.
inline std::string Describe(const Spec& s) {
  std::string r = "H=" + std::to_string(s.H) + " K=" + std::to_string(s.K) + " lengths={";
  if (s.HV > 0) r = "HV=" + std::to_string(s.HV) + " " + r;
  if (s.V > 0) r = "V=" + std::to_string(s.V) + " " + r;
  for (int64_t len : s.lengths) r += std::to_string(len) + ",";
  r += "} gate=";
  r += s.gate == GateKind::kStress ? "stress"
       : s.gate == GateKind::kMild ? "mild"
       : s.gate == GateKind::kLoud ? "loud"
                                   : "none";
  r += s.l2norm_in_kernel ? " l2norm" : "";
  r += s.gate_in_kernel ? " gate_in_kernel" : "";
  r += s.initial_state ? " h0" : " no-h0";
  r += s.beta_sigmoid ? (s.allow_neg_eigval ? " beta=2sigmoid" : " beta=sigmoid") : "";
  r += s.lower_bound < 0.0F ? " lower_bound=" + std::to_string(s.lower_bound) + (s.no_a_log ? " no-A_log" : "") : "";
  r += s.beta_per_value ? " beta-per-value" : "";
  r += s.state_v_first ? " v-first" : "";
  r += s.scalar_gate ? " scalar-gate" : "";
  r += s.delta_correction ? "" : " no-delta";
  r += s.skip ? " D" : "";
  return r;
}

}  // namespace kda::testing
