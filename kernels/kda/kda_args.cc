// Argument checks of the KDA kernels. They run before any output is touched
// and before any parallel loop (the loop bodies must not throw).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"

namespace kda {
namespace {

bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// Checks shared by both kernels: dtypes, head shape, options.
void ValidateCommon(const std::string& who, const ConstBuf& q, const ConstBuf& k, const ConstBuf& v, const ConstBuf& g,
                    const ConstBuf& beta, const MutBuf& o, int heads, int k_dim, int v_dim, const KdaOptions& opt) {
  Check(IsFloatType(q.dtype), [&] { return who + ": q dtype must be F32 or BF16, got " + DTypeName(q.dtype); });
  Check(k.dtype == q.dtype,
        [&] { return who + ": k dtype " + DTypeName(k.dtype) + " differs from q dtype " + DTypeName(q.dtype); });
  Check(v.dtype == q.dtype,
        [&] { return who + ": v dtype " + DTypeName(v.dtype) + " differs from q dtype " + DTypeName(q.dtype); });
  Check(IsFloatType(g.dtype), [&] { return who + ": g dtype must be F32 or BF16, got " + DTypeName(g.dtype); });
  Check(IsFloatType(beta.dtype),
        [&] { return who + ": beta dtype must be F32 or BF16, got " + DTypeName(beta.dtype); });
  Check(o.dtype == q.dtype,
        [&] { return who + ": o dtype " + DTypeName(o.dtype) + " differs from q dtype " + DTypeName(q.dtype); });
  Check(heads >= 1, [&] { return who + ": H must be >= 1, got " + std::to_string(heads); });
  Check(k_dim == v_dim,
        [&] { return who + ": K (" + std::to_string(k_dim) + ") must equal V (" + std::to_string(v_dim) + ")"; });
  Check(k_dim >= 16 && k_dim <= 256 && k_dim % 16 == 0,
        [&] { return who + ": K must be a multiple of 16 in [16, 256], got " + std::to_string(k_dim); });
  Check(std::isfinite(opt.scale), [&] { return who + ": scale must be finite"; });
  Check(!opt.use_gate_in_kernel || opt.A_log != nullptr, [&] { return who + ": use_gate_in_kernel requires A_log"; });
}

// Token buffers are required as soon as there is a token.
void CheckTokenBuffers(const std::string& who, const ConstBuf& q, const ConstBuf& k, const ConstBuf& v,
                       const ConstBuf& g, const ConstBuf& beta, const MutBuf& o) {
  Check(q.data != nullptr, [&] { return who + ": q is null"; });
  Check(k.data != nullptr, [&] { return who + ": k is null"; });
  Check(v.data != nullptr, [&] { return who + ": v is null"; });
  Check(g.data != nullptr, [&] { return who + ": g is null"; });
  Check(beta.data != nullptr, [&] { return who + ": beta is null"; });
  Check(o.data != nullptr, [&] { return who + ": o is null"; });
}

// Indices into a [num_states, ...] state buffer: each < num_states, negative
// for padding, the others distinct.
void CheckStateIndices(const std::string& who, const int32_t* indices, int64_t n_entries, int64_t num_states,
                       const char* name = "state_indices") {
  // (state index, entry) of the non-padding entries; kept per thread so that a
  // steady stream of calls allocates nothing.
  thread_local std::vector<std::pair<int32_t, int64_t>> used;
  used.clear();
  for (int64_t n = 0; n < n_entries; ++n) {
    const int32_t idx = indices[n];
    if (idx < 0) continue;  // padding
    Check(idx < num_states, [&] {
      return who + ": " + name + "[" + std::to_string(n) + "] = " + std::to_string(idx) +
             " is out of range for num_states = " + std::to_string(num_states) + " (use a negative index for padding)";
    });
    used.emplace_back(idx, n);
  }
  // Two entries updating one state would race (and the result would depend on the order).
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i) {
    Check(used[i].first != used[i - 1].first, [&] {
      return who + ": duplicate state index " + std::to_string(used[i].first) + " in " + name + "[" +
             std::to_string(used[i - 1].second) + "] and " + name + "[" + std::to_string(used[i].second) + "]";
    });
  }
}

// Packed sequence boundaries: 0 = cu[0] <= ... <= cu[N] = T.
template <class I>
void CheckCuSeqlens(const std::string& who, const I* cu, int64_t n_seqs, int64_t n_tokens) {
  Check(cu[0] == 0, [&] { return who + ": cu_seqlens[0] must be 0, got " + std::to_string(cu[0]); });
  for (int64_t n = 0; n < n_seqs; ++n) {
    Check(cu[n + 1] >= cu[n], [&] {
      return who + ": cu_seqlens must be non-decreasing, but cu_seqlens[" + std::to_string(n + 1) +
             "] = " + std::to_string(cu[n + 1]) + " < cu_seqlens[" + std::to_string(n) + "] = " + std::to_string(cu[n]);
    });
  }
  Check(cu[n_seqs] == n_tokens, [&] {
    return who + ": cu_seqlens[N] must equal T, got " + std::to_string(cu[n_seqs]) +
           " with T = " + std::to_string(n_tokens);
  });
}

// The mid-sequence snapshots of chunk_kda (see ChunkKdaArgs).
void CheckSnapshots(const std::string& who, const ChunkKdaArgs& a) {
  if (a.snapshot_cu == nullptr) {
    Check(a.snapshot_offsets == nullptr && a.snapshot_states == nullptr,
          [&] { return who + ": snapshot_offsets or snapshot_states given without snapshot_cu"; });
    return;
  }
  Check(a.snapshot_cu[0] == 0, [&] { return who + ": snapshot_cu[0] must be 0"; });
  for (int64_t n = 0; n < a.N; ++n) {
    const int64_t first = a.snapshot_cu[n];
    const int64_t last = a.snapshot_cu[n + 1];
    Check(last >= first, [&] { return who + ": snapshot_cu must be non-decreasing at sequence " + std::to_string(n); });
    if (last == first) continue;
    Check(a.snapshot_offsets != nullptr && a.snapshot_states != nullptr,
          [&] { return who + ": snapshots requested but snapshot_offsets or snapshot_states is null"; });
    for (int64_t j = first; j < last; ++j) {
      Check(a.snapshot_states[j] != nullptr,
            [&] { return who + ": snapshot_states[" + std::to_string(j) + "] is null"; });
    }
    Check(a.state_indices == nullptr || a.state_indices[n] >= 0,
          [&] { return who + ": padding sequence " + std::to_string(n) + " requests snapshots"; });
    const int64_t len = a.cu_seqlens[n + 1] - a.cu_seqlens[n];
    int64_t prev = 0;
    for (int64_t j = first; j < last; ++j) {
      const int64_t off = a.snapshot_offsets[j];
      Check(off > prev && off <= len && (off % kSnapshotAlign == 0 || off == len), [&] {
        return who + ": snapshot_offsets[" + std::to_string(j) + "] = " + std::to_string(off) + " of sequence " +
               std::to_string(n) + " (length " + std::to_string(len) + ") must increase and be a multiple of " +
               std::to_string(kSnapshotAlign) + " in (0, length] or the length";
      });
      prev = off;
    }
  }
}

}  // namespace

namespace {

// The checks that read values (boundaries, snapshots, state indices, how the
// state buffers sit in memory), on arguments whose structure is checked: by
// ValidateChunkKda, or by the call's view checks in a bind.
void CheckChunkValues(const std::string& who, const ChunkKdaArgs& a) {
  CheckCuSeqlens(who, a.cu_seqlens, a.N, a.T);
  CheckSnapshots(who, a);
  if (a.state_indices != nullptr) {
    CheckStateIndices(who, a.state_indices, a.N, a.num_states);
    return;
  }
  if (a.output_final_state && a.initial_state != nullptr && a.initial_state != a.final_state) {
    // Aliasing is supported only as the very same buffer: a shifted overlap would read states already written.
    const size_t bytes = static_cast<size_t>(a.N) * static_cast<size_t>(a.H) * static_cast<size_t>(a.K) *
                         static_cast<size_t>(a.V) * sizeof(float);
    const auto in = reinterpret_cast<uintptr_t>(a.initial_state);
    const auto out = reinterpret_cast<uintptr_t>(a.final_state);
    Check(in + bytes <= out || out + bytes <= in,
          [&] { return who + ": initial_state and final_state overlap without being the same buffer"; });
  }
}

void CheckRecurrentValues(const std::string& who, const RecurrentKdaArgs& a) {
  if (a.N > 0) CheckStateIndices(who, a.state_indices, a.N, a.num_states, "ssm_state_indices");  // the call's name
}

const std::string& ChunkWho() {
  static const std::string who = "chunk_kda";  // built once: a good call allocates nothing
  return who;
}

const std::string& RecurrentWho() {
  static const std::string who = "fused_recurrent_kda";
  return who;
}

}  // namespace

void ValidateChunkKda(const ChunkKdaArgs& a) {
  const std::string& who = ChunkWho();
  ValidateCommon(who, a.q, a.k, a.v, a.g, a.beta, a.o, a.H, a.K, a.V, a.options);
  Check(a.T >= 0, [&] { return who + ": T must be >= 0, got " + std::to_string(a.T); });
  Check(a.N >= 1, [&] { return who + ": N must be >= 1, got " + std::to_string(a.N); });
  if (a.T > 0) CheckTokenBuffers(who, a.q, a.k, a.v, a.g, a.beta, a.o);
  Check(a.cu_seqlens != nullptr, [&] { return who + ": cu_seqlens is null"; });
  if (a.state_indices != nullptr) {
    Check(a.initial_state == nullptr && a.final_state == nullptr,
          [&] { return who + ": state_indices (pool form) excludes initial_state and final_state"; });
    Check(a.state != nullptr, [&] { return who + ": state_indices given but state is null"; });
    Check(a.num_states >= 0, [&] { return who + ": num_states must be >= 0, got " + std::to_string(a.num_states); });
  } else {
    Check(a.state == nullptr, [&] { return who + ": state (pool form) requires state_indices"; });
    Check(!a.output_final_state || a.final_state != nullptr,
          [&] { return who + ": output_final_state requires final_state"; });
  }
  CheckChunkValues(who, a);
}

void ValidateRecurrentKda(const RecurrentKdaArgs& a) {
  const std::string& who = RecurrentWho();
  ValidateCommon(who, a.q, a.k, a.v, a.g, a.beta, a.o, a.H, a.K, a.V, a.options);
  Check(a.N >= 0, [&] { return who + ": N must be >= 0, got " + std::to_string(a.N); });
  Check(a.num_states >= 0, [&] { return who + ": num_states must be >= 0, got " + std::to_string(a.num_states); });
  if (a.N == 0) return;
  CheckTokenBuffers(who, a.q, a.k, a.v, a.g, a.beta, a.o);
  Check(a.state != nullptr, [&] { return who + ": state is null"; });
  Check(a.state_indices != nullptr, [&] { return who + ": state_indices is null"; });
  CheckRecurrentValues(who, a);
}

// ------------------------------------------------------------------ calls

namespace {

// The expected dims of a view, held without allocating.
struct Dims {
  int n = 0;
  int64_t d[kMaxViewDims] = {};
  Dims(std::initializer_list<int64_t> dims) {
    for (int64_t x : dims) d[n++] = x;
  }
  std::vector<int64_t> Vector() const { return {d, d + n}; }
};

template <class V>
std::vector<int64_t> ShapeOf(const V& v) {
  return {v.shape, v.shape + std::max(v.ndim, 0)};
}

template <class V>
const char* ViewDTypeName(const V& v) {
  return v.foreign_dtype != nullptr ? v.foreign_dtype : TorchDTypeName(v.dtype);
}

template <class MessageFn>
void CheckDType(bool ok, MessageFn&& message) {
  if (!ok) throw DTypeError(message());
}

// The checks of one view, each naming it as "WHO: NAME".
class ViewChecker {
 public:
  ViewChecker(const std::string& who, bool full) : who_(who), full_(full) {}

  bool full() const { return full_; }
  const std::string& who() const { return who_; }

  template <class V>
  void Present(const V& v, const char* name, const char* why) const {
    Check(v.present(), [&] { return who_ + ": " + name + ": " + why; });
  }
  template <class V>
  void Ndim(const V& v, const char* name, int ndim, const char* layout) const {
    Present(v, name, "required");
    Check(v.ndim == ndim, [&] {
      return who_ + ": " + name + ": expected a " + std::to_string(ndim) + "-D array " + layout + ", got shape " +
             ShapeString(ShapeOf(v));
    });
    NonNegative(v, name);
  }
  template <class V>
  void NonNegative(const V& v, const char* name) const {
    for (int i = 0; i < v.ndim; ++i) {
      Check(v.shape[i] >= 0,
            [&] { return who_ + ": " + name + ": negative dimension in shape " + ShapeString(ShapeOf(v)); });
    }
  }
  template <class V>
  void Shape(const V& v, const Dims& want, const char* name, const char* layout) const {
    Present(v, name, "required");
    NonNegative(v, name);
    bool ok = v.ndim == want.n;
    for (int i = 0; ok && i < want.n; ++i) ok = v.shape[i] == want.d[i];
    Check(ok, [&] {
      return who_ + ": " + name + ": expected shape " + layout + " = " + ShapeString(want.Vector()) + ", got " +
             ShapeString(ShapeOf(v));
    });
  }
  template <class V>
  DType Float(const V& v, const char* name) const {
    CheckDType(v.foreign_dtype == nullptr && (v.dtype == DType::kF32 || v.dtype == DType::kBF16),
               [&] { return who_ + ": " + name + ": dtype must be float32 or bfloat16, got " + ViewDTypeName(v); });
    return v.dtype;
  }
  template <class V>
  void Exact(const V& v, DType want, const char* name) const {
    CheckDType(v.foreign_dtype == nullptr && v.dtype == want, [&] {
      return who_ + ": " + name + ": dtype must be " + TorchDTypeName(want) + ", got " + ViewDTypeName(v);
    });
  }
  template <class V>
  void Int(const V& v, const char* name) const {
    CheckDType(v.foreign_dtype == nullptr && (v.dtype == DType::kI32 || v.dtype == DType::kI64),
               [&] { return who_ + ": " + name + ": dtype must be int32 or int64, got " + ViewDTypeName(v); });
  }
  // C-contiguous, and (in a full check) data behind every element.
  template <class V>
  void Layout(const V& v, const char* name) const {
    if (v.strided && v.numel() > 0) {
      int64_t expected = 1;
      for (int i = v.ndim; i-- > 0;) {
        Check(v.shape[i] == 1 || v.strides[i] == expected, [&] {
          return who_ + ": " + name + ": must be C-contiguous (row-major, no gaps); shape " + ShapeString(ShapeOf(v)) +
                 " has stride " + std::to_string(v.strides[i]) + " in dimension " + std::to_string(i) +
                 " (make a contiguous copy first)";
        });
        expected *= v.shape[i];
      }
    }
    if (full_) Check(v.data != nullptr || v.numel() == 0, [&] { return who_ + ": " + name + " is null"; });
  }
  // Elements of a [n] f32 parameter (A_log, dt_bias).
  void Param(const TensorView& v, int64_t n, const char* count, const char* name, const char* layout) const {
    Exact(v, DType::kF32, name);
    Check(v.numel() == n, [&] {
      return who_ + ": " + name + ": expected " + count + " = " + std::to_string(n) + " elements (" + layout +
             "), got shape " + ShapeString(ShapeOf(v));
    });
    Layout(v, name);
  }

 private:
  const std::string& who_;
  bool full_;
};

// Element i of an int32 or int64 view.
int64_t IndexAt(const TensorView& v, int64_t i) {
  return v.dtype == DType::kI64 ? static_cast<const int64_t*>(v.data)[i] : static_cast<const int32_t*>(v.data)[i];
}

// q, k, v, g, beta (and o when present): shapes, dtypes, layouts, the head shape.
template <class Call>
KdaCallShapes CheckTokens(const ViewChecker& c, const Call& call) {
  KdaCallShapes s;
  c.Ndim(call.q, "q", 4, "[B, T, H, K]");
  c.Ndim(call.v, "v", 4, "[B, T, H, V]");
  s.B = call.q.shape[0];
  s.T = call.q.shape[1];
  const int64_t h = call.q.shape[2];
  const int64_t kd = call.q.shape[3];
  const int64_t vd = call.v.shape[3];
  c.Shape(call.k, {s.B, s.T, h, kd}, "k", "[B, T, H, K] (q's shape)");
  c.Shape(call.v, {s.B, s.T, h, vd}, "v", "[B, T, H, V] (B, T, H of q)");
  c.Shape(call.g, {s.B, s.T, h, kd}, "g", "[B, T, H, K] (q's shape)");
  c.Shape(call.beta, {s.B, s.T, h}, "beta", "[B, T, H]");
  const std::string& who = c.who();
  const DType qt = c.Float(call.q, "q");
  const DType kt = c.Float(call.k, "k");
  const DType vt = c.Float(call.v, "v");
  CheckDType(kt == qt && vt == qt, [&] {
    return who + ": q, k and v must have one dtype, got " + TorchDTypeName(qt) + ", " + TorchDTypeName(kt) + ", " +
           TorchDTypeName(vt);
  });
  c.Float(call.g, "g");
  c.Float(call.beta, "beta");
  c.Layout(call.q, "q");
  c.Layout(call.k, "k");
  c.Layout(call.v, "v");
  c.Layout(call.g, "g");
  c.Layout(call.beta, "beta");
  Check(h >= 1, [&] { return who + ": H must be >= 1, got " + std::to_string(h); });
  Check(kd == vd, [&] {
    return who + ": the kernels need K == V, got K = " + std::to_string(kd) + ", V = " + std::to_string(vd);
  });
  Check(kd >= 16 && kd <= 256 && kd % 16 == 0,
        [&] { return who + ": K must be a multiple of 16 in [16, 256], got " + std::to_string(kd); });
  s.H = static_cast<int>(h);
  s.K = static_cast<int>(kd);
  s.V = static_cast<int>(vd);
  if (c.full()) c.Present(call.o, "o", "required (the output [B, T, H, V])");
  if (call.o.present()) {
    CheckDType(call.o.foreign_dtype == nullptr && call.o.dtype == qt, [&] {
      return who + ": o: dtype must be q's (" + TorchDTypeName(qt) + "), got " + ViewDTypeName(call.o);
    });
    c.Shape(call.o, {s.B, s.T, h, vd}, "o", "[B, T, H, V]");
    c.Layout(call.o, "o");
  }
  Check(!call.scale || (std::isfinite(*call.scale) && *call.scale > 0.0F), [&] {
    return who + ": scale: must be a finite number > 0 (absent: K^-0.5), got " + std::to_string(*call.scale);
  });
  if (call.use_gate_in_kernel) {
    c.Present(call.A_log, "A_log", "required with use_gate_in_kernel=True (shape [H])");
    c.Param(call.A_log, s.H, "H", "A_log", "[H]");
    if (call.dt_bias.present())
      c.Param(call.dt_bias, static_cast<int64_t>(s.H) * s.K, "H*K", "dt_bias", "[H*K] or [H, K]");
  }
  return s;
}

// A state buffer [S, H, K, V] f32 (S = `rows` unless negative); returns S.
template <class V>
int64_t CheckStates(const ViewChecker& c, const V& v, const KdaCallShapes& s, int64_t rows, const char* name,
                    const char* layout) {
  c.Exact(v, DType::kF32, name);
  c.Ndim(v, name, 4, layout);
  const int64_t S = v.shape[0];
  c.Shape(v, {rows < 0 ? S : rows, s.H, s.K, s.V}, name, layout);
  c.Layout(v, name);
  return S;
}

// [N] int32 state indices; their values are checked here only in a shape
// check (a bind leaves them to the kernel arguments' validation).
void CheckIndexView(const ViewChecker& c, const TensorView& v, int64_t n, int64_t num_states, const char* name) {
  c.Exact(v, DType::kI32, name);
  c.Shape(v, {n}, name, "[N]");
  c.Layout(v, name);
  if (!c.full() && v.data != nullptr) {
    CheckStateIndices(c.who(), static_cast<const int32_t*>(v.data), n, num_states, name);
  }
}

KdaCallShapes CheckChunkCall(const ChunkKdaCall& call, bool full) {
  const std::string& who = ChunkWho();
  const ViewChecker c(who, full);
  KdaCallShapes s = CheckTokens(c, call);
  if (call.cu_seqlens.present()) {
    c.Int(call.cu_seqlens, "cu_seqlens");
    Check(call.cu_seqlens.ndim == 1 && call.cu_seqlens.shape[0] >= 2, [&] {
      return who + ": cu_seqlens: expected shape [N + 1] with N >= 1, got " + ShapeString(ShapeOf(call.cu_seqlens));
    });
    c.Layout(call.cu_seqlens, "cu_seqlens");
    Check(s.B == 1, [&] {
      return who + ": q: with cu_seqlens the batch must be packed as B = 1, got shape " + ShapeString(ShapeOf(call.q));
    });
    s.N = call.cu_seqlens.shape[0] - 1;
    if (!full && call.cu_seqlens.data != nullptr) {
      if (call.cu_seqlens.dtype == DType::kI64) {
        CheckCuSeqlens(who, static_cast<const int64_t*>(call.cu_seqlens.data), s.N, s.T);
      } else {
        CheckCuSeqlens(who, static_cast<const int32_t*>(call.cu_seqlens.data), s.N, s.T);
      }
    }
  } else {
    Check(s.B >= 1, [&] {
      return who + ": q: chunk_kda needs at least one sequence (B >= 1), got shape " + ShapeString(ShapeOf(call.q));
    });
    s.N = s.B;
  }
  if (call.state_indices.present()) {
    Check(!call.initial_state.present() && !call.final_state.present(),
          [&] { return who + ": state_indices (pool form) excludes initial_state and final_state"; });
    c.Present(call.state, "state_indices", "needs the state pool (state [S, H, K, V])");
    s.num_states = CheckStates(c, call.state, s, -1, "state", "[S, H, K, V]");
    CheckIndexView(c, call.state_indices, s.N, s.num_states, "state_indices");
  } else {
    Check(!call.state.present(), [&] { return who + ": state (pool form) requires state_indices"; });
    if (call.initial_state.present()) {
      CheckStates(c, call.initial_state, s, s.N, "initial_state", "[N, H, K, V]");
    }
    if (call.output_final_state && full) {
      c.Present(call.final_state, "final_state", "required with output_final_state (shape [N, H, K, V])");
    }
    if (call.final_state.present()) {
      Check(call.output_final_state, [&] { return who + ": final_state given without output_final_state"; });
      CheckStates(c, call.final_state, s, s.N, "final_state", "[N, H, K, V]");
    }
  }
  if (call.has_initial_state.present()) {
    c.Exact(call.has_initial_state, DType::kU8, "has_initial_state");
    c.Shape(call.has_initial_state, {s.N}, "has_initial_state", "[N]");
    c.Layout(call.has_initial_state, "has_initial_state");
  }
  return s;
}

KdaCallShapes CheckRecurrentCall(const RecurrentKdaCall& call, bool full) {
  const std::string& who = RecurrentWho();
  const ViewChecker c(who, full);
  KdaCallShapes s = CheckTokens(c, call);
  s.N = s.B * s.T;
  if (call.cu_seqlens.present()) {
    c.Int(call.cu_seqlens, "cu_seqlens");
    c.Shape(call.cu_seqlens, {s.N + 1}, "cu_seqlens", "[N + 1] (decode: one token per sequence)");
    c.Layout(call.cu_seqlens, "cu_seqlens");
    Check(s.B == 1, [&] {
      return who + ": q: with cu_seqlens the batch must be packed as B = 1, got shape " + ShapeString(ShapeOf(call.q));
    });
    if (call.cu_seqlens.data != nullptr) {
      for (int64_t i = 0; i <= s.N; ++i) {
        Check(IndexAt(call.cu_seqlens, i) == i, [&] {
          return who + ": decodes one token per sequence, but cu_seqlens[" + std::to_string(i) +
                 "] = " + std::to_string(IndexAt(call.cu_seqlens, i)) + " (want " + std::to_string(i) + ")";
        });
      }
    }
  } else {
    Check(s.T == 1, [&] {
      return who +
             ": q: decodes one token per sequence: expected [N, 1, H, K] (or [1, N, H, K] with cu_seqlens "
             "[0, 1, ..., N]), got shape " +
             ShapeString(ShapeOf(call.q));
    });
  }
  // The pool and its indices may be absent in a shape check only (a caller asking for N first).
  if (call.ssm_state_indices.present()) {
    c.Present(call.initial_state, "ssm_state_indices", "needs the state pool initial_state [S, H, K, V]");
  }
  if (full) c.Present(call.initial_state, "initial_state", "required (the state pool [S, H, K, V])");
  if (call.initial_state.present()) {
    s.num_states = CheckStates(c, call.initial_state, s, -1, "initial_state", "[S, H, K, V] (the state pool)");
  }
  if (full) c.Present(call.ssm_state_indices, "ssm_state_indices", "required ([N] int32)");
  if (call.ssm_state_indices.present()) {
    CheckIndexView(c, call.ssm_state_indices, s.N, s.num_states, "ssm_state_indices");
  }
  return s;
}

KdaOptions OptionsOf(bool l2norm, bool gate, const std::optional<float>& scale, const TensorView& a_log,
                     const TensorView& dt_bias) {
  KdaOptions o;
  o.scale = scale.value_or(0.0F);
  o.use_qk_l2norm_in_kernel = l2norm;
  o.use_gate_in_kernel = gate;
  if (gate) {
    o.A_log = static_cast<const float*>(a_log.data);
    o.dt_bias = dt_bias.present() ? static_cast<const float*>(dt_bias.data) : nullptr;
  }
  return o;
}

ConstBuf Buf(const TensorView& v) { return {v.data, v.dtype}; }

// The fields both kernels' arguments share.
template <class Args, class Call>
void BindCommon(Args& a, const Call& call, const KdaCallShapes& s) {
  a.o = {call.o.data, call.o.dtype};
  a.q = Buf(call.q);
  a.k = Buf(call.k);
  a.v = Buf(call.v);
  a.g = Buf(call.g);
  a.beta = Buf(call.beta);
  a.H = s.H;
  a.K = s.K;
  a.V = s.V;
  a.options = OptionsOf(call.use_qk_l2norm_in_kernel, call.use_gate_in_kernel, call.scale, call.A_log, call.dt_bias);
}

}  // namespace

KdaCallShapes CheckChunkKdaShapes(const ChunkKdaCall& call) { return CheckChunkCall(call, false); }
KdaCallShapes CheckRecurrentKdaShapes(const RecurrentKdaCall& call) { return CheckRecurrentCall(call, false); }

ChunkKdaArgs BindChunkKda(const ChunkKdaCall& call) {
  const KdaCallShapes s = CheckChunkCall(call, true);
  ChunkKdaArgs a;
  BindCommon(a, call, s);
  a.final_state = static_cast<float*>(call.final_state.data);
  if (call.cu_seqlens.present() && call.cu_seqlens.dtype == DType::kI64) {
    a.cu_seqlens = static_cast<const int64_t*>(call.cu_seqlens.data);
  } else {
    // int32 boundaries widened, or the B rows' [0, T, 2T, ...]; the buffer grows once per thread.
    thread_local std::vector<int64_t> cu;
    cu.resize(static_cast<size_t>(s.N) + 1);
    for (int64_t n = 0; n <= s.N; ++n) cu[n] = call.cu_seqlens.present() ? IndexAt(call.cu_seqlens, n) : n * s.T;
    a.cu_seqlens = cu.data();
  }
  a.initial_state = static_cast<const float*>(call.initial_state.data);
  a.state = static_cast<float*>(call.state.data);
  a.state_indices = static_cast<const int32_t*>(call.state_indices.data);
  a.num_states = s.num_states;
  a.has_initial_state = static_cast<const uint8_t*>(call.has_initial_state.data);
  a.output_final_state = call.state_indices.present() || call.output_final_state;
  a.snapshot_cu = call.snapshot_cu;
  a.snapshot_offsets = call.snapshot_offsets;
  a.snapshot_states = call.snapshot_states;
  a.T = s.B * s.T;
  a.N = s.N;
  CheckChunkValues(ChunkWho(), a);  // the structure was checked on the views
  return a;
}

RecurrentKdaArgs BindRecurrentKda(const RecurrentKdaCall& call) {
  const KdaCallShapes s = CheckRecurrentCall(call, true);
  RecurrentKdaArgs a;
  BindCommon(a, call, s);
  a.state = static_cast<float*>(call.initial_state.data);
  a.state_indices = static_cast<const int32_t*>(call.ssm_state_indices.data);
  a.num_states = s.num_states;
  a.N = s.N;
  CheckRecurrentValues(RecurrentWho(), a);
  return a;
}

}  // namespace kda
