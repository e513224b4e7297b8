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
#include "kernels/isa/constants.h"

namespace kda {
namespace {

using kc::kMaxHeadDim;

bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Checks shared by both kernels: dtypes, head shape, options.
template <class Args>
void ValidateCommon(const std::string& who, const Args& a) {
  Check(IsFloatType(a.q.dtype),
        [&] { return who + ": q dtype must be F32, BF16 or F16, got " + DTypeName(a.q.dtype); });
  Check(a.k.dtype == a.q.dtype,
        [&] { return who + ": k dtype " + DTypeName(a.k.dtype) + " differs from q dtype " + DTypeName(a.q.dtype); });
  Check(a.v.dtype == a.q.dtype,
        [&] { return who + ": v dtype " + DTypeName(a.v.dtype) + " differs from q dtype " + DTypeName(a.q.dtype); });
  Check(IsFloatType(a.g.dtype),
        [&] { return who + ": g dtype must be F32, BF16 or F16, got " + DTypeName(a.g.dtype); });
  Check(IsFloatType(a.beta.dtype),
        [&] { return who + ": beta dtype must be F32, BF16 or F16, got " + DTypeName(a.beta.dtype); });
  // o in q's dtype, or fp32 (an output that a later step rounds once, as Mamba2's y = o + D x).
  Check(a.o.dtype == a.q.dtype || a.o.dtype == DType::kF32, [&] {
    return who + ": o dtype " + DTypeName(a.o.dtype) + " must be q's (" + DTypeName(a.q.dtype) + ") or F32";
  });
  Check(a.H >= 1, [&] { return who + ": H must be >= 1, got " + std::to_string(a.H); });
  Check(a.HV >= a.H && a.HV % a.H == 0, [&] {
    return who + ": HV (" + std::to_string(a.HV) + ") must be a multiple of H (" + std::to_string(a.H) + ")";
  });
  Check(a.K >= 1 && a.K <= kMaxHeadDim, [&] { return who + ": K must be in [1, 256], got " + std::to_string(a.K); });
  Check(a.V >= 1 && a.V <= kMaxHeadDim, [&] { return who + ": V must be in [1, 256], got " + std::to_string(a.V); });
  const auto key_row = static_cast<int64_t>(a.H) * a.K;
  const auto value_row = static_cast<int64_t>(a.HV) * a.V;
  const struct {
    int64_t stride, row;
    const char* name;
  } token_strides[] = {
      {a.token_strides.q, key_row, "q"}, {a.token_strides.k, key_row, "k"}, {a.token_strides.v, value_row, "v"}};
  for (const auto& t : token_strides) {
    Check(t.stride == 0 || t.stride >= t.row, [&] {
      return who + ": " + t.name + " token stride " + std::to_string(t.stride) + " is shorter than its row (" +
             std::to_string(t.row) + " elements); 0 means the contiguous row";
    });
  }
  const KdaOptions& opt = a.options;
  Check(std::isfinite(opt.scale), [&] { return who + ": scale must be finite"; });
  Check(!opt.use_gate_in_kernel || opt.A_log != nullptr || opt.use_lower_bound,
        [&] { return who + ": use_gate_in_kernel requires A_log (or lower_bound)"; });
  Check(!opt.use_lower_bound || (std::isfinite(opt.lower_bound) && opt.lower_bound <= 0.0F),
        [&] { return who + ": lower_bound must be finite and <= 0"; });
  Check(std::isfinite(opt.beta_scale), [&] { return who + ": beta_scale must be finite"; });
  Check(opt.D == nullptr || !opt.delta_correction,
        [&] { return who + ": D (Mamba2's skip o + D v) needs delta_correction false"; });
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

// The mid-sequence snapshots of chunk_kda (see ChunkKdaArgs) and their
// destinations.
void CheckSnapshots(const std::string& who, const ChunkKdaArgs& a) {
  void* const* states = a.snapshot_states;
  if (a.snapshot_cu == nullptr) {
    Check(a.snapshot_offsets == nullptr && states == nullptr,
          [&] { return who + ": snapshot_offsets or snapshot_states given without snapshot_cu"; });
    return;
  }
  Check(a.snapshot_cu[0] == 0, [&] { return who + ": snapshot_cu[0] must be 0"; });
  for (int64_t n = 0; n < a.N; ++n) {
    const int64_t first = a.snapshot_cu[n];
    const int64_t last = a.snapshot_cu[n + 1];
    Check(last >= first, [&] { return who + ": snapshot_cu must be non-decreasing at sequence " + std::to_string(n); });
    if (last == first) continue;
    Check(a.snapshot_offsets != nullptr && states != nullptr,
          [&] { return who + ": snapshots requested but snapshot_offsets or snapshot_states is null"; });
    for (int64_t j = first; j < last; ++j) {
      Check(states[j] != nullptr, [&] { return who + ": snapshot_states[" + std::to_string(j) + "] is null"; });
    }
    Check(a.state_indices == nullptr || a.state_indices[n] >= 0,
          [&] { return who + ": padding sequence " + std::to_string(n) + " requests snapshots"; });
    const int64_t len = a.cu_seqlens[n + 1] - a.cu_seqlens[n];
    int64_t prev = 0;
    for (int64_t j = first; j < last; ++j) {
      const int64_t off = a.snapshot_offsets[j];
      Check(off > prev && off <= len && (off % kSnapshotGrain == 0 || off == len), [&] {
        return who + ": snapshot_offsets[" + std::to_string(j) + "] = " + std::to_string(off) + " of sequence " +
               std::to_string(n) + " (length " + std::to_string(len) + ") must increase and be a multiple of " +
               std::to_string(kSnapshotGrain) + " in (0, length] or the length";
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
    const size_t bytes = static_cast<size_t>(a.N) * static_cast<size_t>(a.HV) * static_cast<size_t>(a.K) *
                         static_cast<size_t>(a.V) * sizeof(float);
    const auto in = reinterpret_cast<uintptr_t>(a.initial_state);
    const auto out = reinterpret_cast<uintptr_t>(a.final_state);
    Check(in + bytes <= out || out + bytes <= in,
          [&] { return who + ": initial_state and final_state overlap without being the same buffer"; });
  }
}

// The slots of fused_recurrent_kda's pool form (see RecurrentKdaArgs): each in
// range, num_accepted_tokens in [1, C], with slots per token (C > 1) no
// sequence longer than C, and no slot touched by two sequences.
void CheckRecurrentSlots(const std::string& who, const RecurrentKdaArgs& a) {
  if (a.index_cols == 1 && a.num_accepted_tokens == nullptr) {
    CheckStateIndices(who, a.state_indices, a.N, a.num_states, "ssm_state_indices");
    return;
  }
  thread_local std::vector<std::pair<int32_t, int64_t>> used;  // (slot, sequence)
  used.clear();
  const int64_t cols = a.index_cols;
  auto slot_name = [&](int64_t n, int64_t c) {
    return "ssm_state_indices[" + std::to_string(n) + ", " + std::to_string(c) + "]";
  };
  for (int64_t n = 0; n < a.N; ++n) {
    int64_t read_col = 0;
    if (a.num_accepted_tokens != nullptr) {
      const int32_t accepted = a.num_accepted_tokens[n];
      Check(accepted >= 1 && accepted <= cols, [&] {
        return who + ": num_accepted_tokens[" + std::to_string(n) + "] = " + std::to_string(accepted) +
               " must be in [1, " + std::to_string(cols) + "] (the columns of ssm_state_indices)";
      });
      read_col = accepted - 1;
    }
    const int32_t read = a.state_indices[n * cols + read_col];
    if (read < 0) continue;  // padding
    const int64_t len = a.cu_seqlens[n + 1] - a.cu_seqlens[n];
    const bool writes = a.write_slots;
    Check(!writes || cols == 1 || len <= cols, [&] {
      return who + ": sequence " + std::to_string(n) + " has " + std::to_string(len) +
             " tokens but ssm_state_indices has " + std::to_string(cols) + " slots per sequence";
    });
    const size_t first = used.size();
    auto use = [&](int32_t slot, int64_t c) {
      if (slot < 0) return;
      Check(slot < a.num_states, [&] {
        return who + ": " + slot_name(n, c) + " = " + std::to_string(slot) +
               " is out of range for num_states = " + std::to_string(a.num_states) +
               " (use a negative index for padding)";
      });
      used.emplace_back(slot, n);
    };
    use(read, read_col);
    if (writes && cols > 1) {
      for (int64_t t = 0; t < len; ++t) use(a.state_indices[n * cols + t], t);
    }
    // A sequence may read and write one slot; only other sequences' slots must differ.
    std::sort(used.begin() + static_cast<std::ptrdiff_t>(first), used.end());
    used.erase(std::unique(used.begin() + static_cast<std::ptrdiff_t>(first), used.end()), used.end());
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i) {
    Check(used[i].first != used[i - 1].first, [&] {
      return who + ": state slot " + std::to_string(used[i].first) + " is used by sequences " +
             std::to_string(used[i - 1].second) + " and " + std::to_string(used[i].second) +
             " of ssm_state_indices (each sequence needs its own slots)";
    });
  }
}

void CheckRecurrentValues(const std::string& who, const RecurrentKdaArgs& a) {
  CheckCuSeqlens(who, a.cu_seqlens, a.N, a.T);
  if (a.state_indices != nullptr) CheckRecurrentSlots(who, a);
}

// The names of the entries (built once: a good call allocates nothing).
const std::string& ChunkWho(DeltaRuleEntry entry = DeltaRuleEntry::kKda) {
  static const std::string kda = "chunk_kda";
  static const std::string gdn = "chunk_gated_delta_rule";
  return entry == DeltaRuleEntry::kGatedDeltaRule ? gdn : kda;
}

const std::string& RecurrentWho(DeltaRuleEntry entry = DeltaRuleEntry::kKda) {
  static const std::string kda = "fused_recurrent_kda";
  static const std::string gdn = "fused_recurrent_gated_delta_rule";
  return entry == DeltaRuleEntry::kGatedDeltaRule ? gdn : kda;
}

}  // namespace

void ValidateChunkKda(const ChunkKdaArgs& a) {
  const std::string& who = ChunkWho();
  ValidateCommon(who, a);
  Check(a.T >= 0, [&] { return who + ": T must be >= 0, got " + std::to_string(a.T); });
  Check(a.N >= 1, [&] { return who + ": N must be >= 1, got " + std::to_string(a.N); });
  if (a.T > 0) CheckTokenBuffers(who, a.q, a.k, a.v, a.g, a.beta, a.o);
  Check(a.cu_seqlens != nullptr, [&] { return who + ": cu_seqlens is null"; });
  if (a.intermediate_states.data != nullptr) {
    Check(IsFloatType(a.intermediate_states.dtype), [&] {
      return who + ": intermediate_states dtype must be F32, BF16 or F16, got " +
             DTypeName(a.intermediate_states.dtype);
    });
    Check(a.chunk_size == 32 || a.chunk_size == 64,
          [&] { return who + ": chunk_size must be 32 or 64, got " + std::to_string(a.chunk_size); });
    Check(a.snapshot_cu == nullptr, [&] { return who + ": snapshots exclude intermediate_states"; });
  }
  Check(IsFloatType(a.snapshot_dtype),
        [&] { return who + ": snapshot_dtype must be F32, BF16 or F16, got " + DTypeName(a.snapshot_dtype); });
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
  ValidateCommon(who, a);
  Check(a.T >= 0, [&] { return who + ": T must be >= 0, got " + std::to_string(a.T); });
  Check(a.N >= 0, [&] { return who + ": N must be >= 0, got " + std::to_string(a.N); });
  Check(a.cu_seqlens != nullptr, [&] { return who + ": cu_seqlens is null"; });
  if (a.T > 0) CheckTokenBuffers(who, a.q, a.k, a.v, a.g, a.beta, a.o);
  if (a.state_indices != nullptr) {
    Check(a.initial_state == nullptr && a.final_state == nullptr,
          [&] { return who + ": state_indices (pool form) excludes initial_state and final_state"; });
    Check(a.state != nullptr, [&] { return who + ": state_indices given but state is null"; });
    Check(a.num_states >= 0, [&] { return who + ": num_states must be >= 0, got " + std::to_string(a.num_states); });
    Check(!a.write_slots || a.token_states == nullptr,
          [&] { return who + ": token_states (a state per token) excludes write_slots"; });
    Check(a.index_cols >= 1, [&] { return who + ": index_cols must be >= 1"; });
  } else {
    Check(a.state == nullptr && a.token_states == nullptr && a.num_accepted_tokens == nullptr,
          [&] { return who + ": state, token_states and num_accepted_tokens (pool form) require state_indices"; });
  }
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

// The token stride of a 4-D view [B, T, heads, dim] (see ViewChecker::TokenLayout): 0 when its tokens are
// contiguous rows, s when its rows are contiguous and its B * T tokens are s >= heads * dim elements apart
// (strides [T * s, s, dim, 1]; a unit dimension's stride is never read), -1 otherwise.
template <class V>
int64_t TokenStrideOf(const V& v) {
  if (!v.strided || v.numel() == 0) return 0;
  const int64_t b = v.shape[0], t = v.shape[1], heads = v.shape[2], dim = v.shape[3];
  int64_t row = 0;
  if (__builtin_mul_overflow(heads, dim, &row)) return -1;
  if ((dim != 1 && v.strides[3] != 1) || (heads != 1 && v.strides[2] != dim)) return -1;
  // The stride from one token to the next among the B * T (B's stride when T = 1).
  const int64_t s = t > 1 ? v.strides[1] : (b > 1 ? v.strides[0] : row);
  if (s < row) return -1;
  int64_t batch = 0;
  if (b > 1 && t > 1 && (__builtin_mul_overflow(t, s, &batch) || v.strides[0] != batch)) return -1;
  return s == row ? 0 : s;
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
    CheckDType(v.foreign_dtype == nullptr && IsFloatType(v.dtype), [&] {
      return who_ + ": " + name + ": dtype must be float32, bfloat16 or float16, got " + ViewDTypeName(v);
    });
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
  // A [B, T, heads, dim] token view (q, k, v) the kernels read in place: C-contiguous, or token-strided
  // (see QkvTokenStrides). Returns the elements between consecutive tokens of the B * T, 0 for the
  // contiguous row.
  template <class V>
  int64_t TokenLayout(const V& v, const char* name) const {
    const int64_t stride = TokenStrideOf(v);
    Check(stride >= 0, [&] {
      return who_ + ": " + name + ": must be C-contiguous or a token-strided slice [B, T, heads, dim] with strides " +
             "[T * s, s, dim, 1], s >= heads * dim (a fused projection's columns); shape " + ShapeString(ShapeOf(v)) +
             " has strides " + ShapeString(std::vector<int64_t>(v.strides, v.strides + v.ndim)) +
             " (make a contiguous copy first)";
    });
    if (full_) Check(v.data != nullptr || v.numel() == 0, [&] { return who_ + ": " + name + " is null"; });
    return stride;
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

// [N + 1] boundaries: dtype, shape, B = 1; their values when given in a shape check. Returns N.
int64_t CheckCuSeqlensView(const ViewChecker& c, const TensorView& cu, const KdaCallShapes& s, const TensorView& q,
                           int64_t min_sequences) {
  const std::string& who = c.who();
  c.Int(cu, "cu_seqlens");
  Check(cu.ndim == 1 && cu.shape[0] >= min_sequences + 1, [&] {
    return who + ": cu_seqlens: expected shape [N + 1]" + (min_sequences > 0 ? " with N >= 1" : "") + ", got " +
           ShapeString(ShapeOf(cu));
  });
  c.Layout(cu, "cu_seqlens");
  Check(s.B == 1, [&] {
    return who + ": q: with cu_seqlens the batch must be packed as B = 1, got shape " + ShapeString(ShapeOf(q));
  });
  const int64_t n = cu.shape[0] - 1;
  if (!c.full() && cu.data != nullptr) {
    if (cu.dtype == DType::kI64) {
      CheckCuSeqlens(who, static_cast<const int64_t*>(cu.data), n, s.T);
    } else {
      CheckCuSeqlens(who, static_cast<const int32_t*>(cu.data), n, s.T);
    }
  }
  return n;
}

// q, k, v, g, beta (and o when present): shapes, dtypes, layouts, the head
// shape, the options, the sequences (chunk_kda needs one; fused_recurrent_kda
// none). beta may be [B, T, HV, V] where `beta_per_value_allowed`.
KdaCallShapes CheckTokens(const ViewChecker& c, const KdaCallCommon& call, bool beta_per_value_allowed,
                          int64_t min_sequences) {
  KdaCallShapes s;
  c.Ndim(call.q, "q", 4, "[B, T, H, K]");
  c.Ndim(call.v, "v", 4, "[B, T, HV, V]");
  s.B = call.q.shape[0];
  s.T = call.q.shape[1];
  const int64_t h = call.q.shape[2];
  const int64_t kd = call.q.shape[3];
  const int64_t hv = call.v.shape[2];
  const int64_t vd = call.v.shape[3];
  c.Shape(call.k, {s.B, s.T, h, kd}, "k", "[B, T, H, K] (q's shape)");
  c.Shape(call.v, {s.B, s.T, hv, vd}, "v", "[B, T, HV, V] (B, T of q)");
  // g's width: a decay per key dimension (KDA), or one per value head (GDN; the only form of
  // chunk_gated_delta_rule).
  const bool gdn_chunk = call.entry == DeltaRuleEntry::kGatedDeltaRule && min_sequences > 0;
  s.scalar_gate = call.g.ndim == 3 || gdn_chunk;
  if (s.scalar_gate) {
    c.Shape(call.g, {s.B, s.T, hv}, "g",
            gdn_chunk ? "[B, T, HV] (HV of v)"
                      : "[B, T, HV] (HV of v: a gate per value head; [B, T, HV, K]: one per key dimension)");
  } else {
    c.Shape(call.g, {s.B, s.T, hv, kd}, "g", "[B, T, HV, K] (HV of v, K of q; [B, T, HV]: a gate per value head)");
  }
  if (beta_per_value_allowed && call.beta.ndim == 4) {
    c.Shape(call.beta, {s.B, s.T, hv, vd}, "beta", "[B, T, HV] or [B, T, HV, V]");
  } else {
    c.Shape(call.beta, {s.B, s.T, hv}, "beta", beta_per_value_allowed ? "[B, T, HV] or [B, T, HV, V]" : "[B, T, HV]");
  }
  const std::string& who = c.who();
  // Each of q, k and v any float dtype, as fla reads them (the kernels take one: see chunk_kda).
  const DType qt = c.Float(call.q, "q");
  c.Float(call.k, "k");
  const DType vt = c.Float(call.v, "v");
  c.Float(call.g, "g");
  c.Float(call.beta, "beta");
  s.token_strides = {c.TokenLayout(call.q, "q"), c.TokenLayout(call.k, "k"), c.TokenLayout(call.v, "v")};
  c.Layout(call.g, "g");
  c.Layout(call.beta, "beta");
  Check(h >= 1, [&] { return who + ": H must be >= 1, got " + std::to_string(h); });
  Check(hv >= 1 && hv % h == 0, [&] {
    return who + ": v: the value heads HV = " + std::to_string(hv) +
           " must be a multiple of the query/key heads H = " + std::to_string(h) + " (grouped value heads)";
  });
  Check(kd >= 1 && kd <= kMaxHeadDim,
        [&] { return who + ": q: the key head dim K must be in [1, 256], got " + std::to_string(kd); });
  Check(vd >= 1 && vd <= kMaxHeadDim,
        [&] { return who + ": v: the value head dim V must be in [1, 256], got " + std::to_string(vd); });
  s.H = static_cast<int>(h);
  s.HV = static_cast<int>(hv);
  s.K = static_cast<int>(kd);
  s.V = static_cast<int>(vd);
  if (c.full()) c.Present(call.o, "o", "required (the output [B, T, HV, V])");
  if (call.o.present()) {
    // fla's: the chunk entries return o in q's dtype, the recurrent ones in v's.
    const bool chunk = min_sequences > 0;
    const DType ot = chunk ? qt : vt;
    CheckDType(call.o.foreign_dtype == nullptr && call.o.dtype == ot, [&] {
      return who + ": o: dtype must be " + (chunk ? "q's (" : "v's (") + TorchDTypeName(ot) + "), got " +
             ViewDTypeName(call.o);
    });
    c.Shape(call.o, {s.B, s.T, hv, vd}, "o", "[B, T, HV, V]");
    c.Layout(call.o, "o");
  }
  Check(!call.scale || (std::isfinite(*call.scale) && *call.scale > 0.0F), [&] {
    return who + ": scale: must be a finite number > 0 (absent: K^-0.5), got " + std::to_string(*call.scale);
  });
  Check(!call.allow_neg_eigval || call.use_beta_sigmoid_in_kernel,
        [&] { return who + ": allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"; });
  Check(!call.lower_bound || (std::isfinite(*call.lower_bound) && *call.lower_bound <= 0.0F), [&] {
    return who + ": lower_bound: must be a finite number <= 0 (a log decay bound), got " +
           std::to_string(*call.lower_bound);
  });
  if (call.use_gate_in_kernel) {
    if (!call.lower_bound) {
      c.Present(call.A_log, "A_log", "required with use_gate_in_kernel=True when lower_bound is not set (shape [HV])");
    }
    if (call.A_log.present()) c.Param(call.A_log, s.HV, "HV", "A_log", "[HV]");
    if (call.dt_bias.present() && s.scalar_gate) {
      c.Param(call.dt_bias, s.HV, "HV", "dt_bias", "[HV], one per value head with a scalar gate g");
    } else if (call.dt_bias.present()) {
      c.Param(call.dt_bias, static_cast<int64_t>(s.HV) * s.K, "HV*K", "dt_bias", "[HV*K] or [HV, K]");
    }
  }
  if (call.D.present()) {
    Check(!call.delta_correction,
          [&] { return who + ": D: Mamba2's skip o + D v needs delta_correction=False (the SSD recurrence)"; });
    c.Param(call.D, s.HV, "HV", "D", "[HV]");
  }
  if (call.cu_seqlens.present()) {
    s.N = CheckCuSeqlensView(c, call.cu_seqlens, s, call.q, min_sequences);
  } else {
    Check(s.B >= min_sequences, [&] {
      return who + ": q: chunk_kda needs at least one sequence (B >= 1), got shape " + ShapeString(ShapeOf(call.q));
    });
    s.N = s.B;
  }
  return s;
}

// A state buffer [rows, HV, K, V] f32 ([rows, HV, V, K] with state_v_first; rows = S, any, when negative);
// returns its rows.
template <class V>
int64_t CheckStates(const ViewChecker& c, const V& v, const KdaCallShapes& s, bool v_first, int64_t rows,
                    const char* name, const char* rows_name, bool any_float = false) {
  const std::string layout = std::string("[") + rows_name + (v_first ? ", HV, V, K] (state_v_first)" : ", HV, K, V]");
  if (any_float) {
    c.Float(v, name);
  } else {
    c.Exact(v, DType::kF32, name);
  }
  c.Ndim(v, name, 4, layout.c_str());
  const int64_t S = v.shape[0];
  const int64_t r = rows < 0 ? S : rows;
  c.Shape(v, v_first ? Dims{r, s.HV, s.V, s.K} : Dims{r, s.HV, s.K, s.V}, name, layout.c_str());
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

// NT of the call (KdaCallShapes::num_chunks). A bind checks cu_seqlens' values
// later (CheckChunkValues); they are checked here first, as the count depends
// on them.
int64_t NumChunks(const ViewChecker& c, const ChunkKdaCall& call, const KdaCallShapes& s) {
  const int64_t cs = call.chunk_size;
  const TensorView& cu = call.cu_seqlens;
  if (!cu.present()) return (s.T + cs - 1) / cs;
  if (cu.data == nullptr) return -1;
  if (c.full()) {
    if (cu.dtype == DType::kI64) {
      CheckCuSeqlens(c.who(), static_cast<const int64_t*>(cu.data), s.N, s.T);
    } else {
      CheckCuSeqlens(c.who(), static_cast<const int32_t*>(cu.data), s.N, s.T);
    }
  }
  int64_t nt = 0;
  for (int64_t n = 0; n < s.N; ++n) nt += (IndexAt(cu, n + 1) - IndexAt(cu, n) + cs - 1) / cs;
  return nt;
}

// fla's h: [B, NT, HV, K, V] ([.., V, K] with state_v_first) in k's dtype, with return_intermediate_states.
void CheckIntermediateStates(const ViewChecker& c, const ChunkKdaCall& call, const KdaCallShapes& s) {
  const std::string& who = c.who();
  const MutTensorView& h = call.intermediate_states;
  const bool vf = call.state_v_first;
  const char* layout = vf ? "[B, NT, HV, V, K] (state_v_first)" : "[B, NT, HV, K, V]";
  if (call.return_intermediate_states) {
    Check(call.snapshot_cu == nullptr,
          [&] { return who + ": return_intermediate_states excludes the prefix cache's snapshots (snapshot_cu)"; });
    if (c.full()) {
      c.Present(h, "intermediate_states",
                vf ? "required with return_intermediate_states (shape [B, NT, HV, V, K])"
                   : "required with return_intermediate_states (shape [B, NT, HV, K, V])");
    }
  }
  if (!h.present()) return;
  Check(call.return_intermediate_states,
        [&] { return who + ": intermediate_states given without return_intermediate_states"; });
  CheckDType(h.foreign_dtype == nullptr && h.dtype == call.k.dtype, [&] {
    return who + ": intermediate_states: dtype must be k's (" + TorchDTypeName(call.k.dtype) + "), got " +
           ViewDTypeName(h);
  });
  c.Ndim(h, "intermediate_states", 5, layout);
  const int64_t nt = s.num_chunks >= 0 ? s.num_chunks : h.shape[1];  // unknown in a shape check: any
  c.Shape(h, vf ? Dims{s.B, nt, s.HV, s.V, s.K} : Dims{s.B, nt, s.HV, s.K, s.V}, "intermediate_states", layout);
  c.Layout(h, "intermediate_states");
}

KdaCallShapes CheckChunkCall(const ChunkKdaCall& call, bool full) {
  const std::string& who = ChunkWho(call.entry);
  const ViewChecker c(who, full);
  KdaCallShapes s = CheckTokens(c, call, false, 1);
  // fla's rules and wording: 32 or 64 for KDA; 16, 32 or 64 for Gated DeltaNet (which has no intermediate
  // states to size: the kernels' results do not depend on it).
  if (call.entry == DeltaRuleEntry::kGatedDeltaRule) {
    const int cs = call.chunk_size;
    Check(cs == 16 || cs == 32 || cs == 64, [&] {
      return who + ": `chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got " + std::to_string(cs) + ".";
    });
  } else {
    Check(call.chunk_size == 32 || call.chunk_size == 64, [&] {
      return who + ": `chunk_size` must be either 32 or 64 for KDA, got " + std::to_string(call.chunk_size) + ".";
    });
  }
  if (call.safe_gate && call.use_gate_in_kernel) {
    Check(call.lower_bound.has_value(),
          [&] { return who + ": lower_bound must be specified when safe_gate=True and use_gate_in_kernel=True"; });
    Check(*call.lower_bound >= -5.0F && *call.lower_bound < 0.0F, [&] {
      return who + ": lower_bound must be in the safe range [-5, 0), got " + std::to_string(*call.lower_bound);
    });
  }
  const bool vf = call.state_v_first;
  if (call.state_indices.present()) {
    Check(!call.initial_state.present() && !call.final_state.present(),
          [&] { return who + ": state_indices (pool form) excludes initial_state and final_state"; });
    c.Present(call.state, "state_indices", "needs the state pool (state [S, HV, K, V])");
    s.num_states = CheckStates(c, call.state, s, vf, -1, "state", "S");
    CheckIndexView(c, call.state_indices, s.N, s.num_states, "state_indices");
  } else {
    Check(!call.state.present(), [&] { return who + ": state (pool form) requires state_indices"; });
    // fla's chunk_gated_delta_rule takes a float16 or bfloat16 initial state; its chunk_kda asserts float32.
    if (call.initial_state.present()) {
      CheckStates(c, call.initial_state, s, vf, s.N, "initial_state", "N",
                  /*any_float=*/call.entry == DeltaRuleEntry::kGatedDeltaRule);
    }
    if (call.output_final_state && full) {
      c.Present(call.final_state, "final_state", "required with output_final_state (shape [N, HV, K, V])");
    }
    if (call.final_state.present()) {
      Check(call.output_final_state, [&] { return who + ": final_state given without output_final_state"; });
      CheckStates(c, call.final_state, s, vf, s.N, "final_state", "N");
    }
  }
  if (call.has_initial_state.present()) {
    c.Exact(call.has_initial_state, DType::kU8, "has_initial_state");
    c.Shape(call.has_initial_state, {s.N}, "has_initial_state", "[N]");
    c.Layout(call.has_initial_state, "has_initial_state");
  }
  // A bind needs the count only for intermediate_states.
  if (!full || call.return_intermediate_states) s.num_chunks = NumChunks(c, call, s);
  CheckIntermediateStates(c, call, s);
  return s;
}

// The sequence boundaries as int64: the call's own, or int32 ones widened, or
// the B rows' [0, T, 2T, ...], in `buffer` (which grows once per thread).
const int64_t* BoundariesOf(const KdaCallCommon& call, const KdaCallShapes& s, std::vector<int64_t>& buffer) {
  if (call.cu_seqlens.present() && call.cu_seqlens.dtype == DType::kI64) {
    return static_cast<const int64_t*>(call.cu_seqlens.data);
  }
  buffer.resize(static_cast<size_t>(s.N) + 1);
  for (int64_t n = 0; n <= s.N; ++n) buffer[n] = call.cu_seqlens.present() ? IndexAt(call.cu_seqlens, n) : n * s.T;
  return buffer.data();
}

// The pool form's slot values in a shape check, when their data is given: the
// rules of a bind (CheckRecurrentSlots). Slots per token (or accepted counts)
// also need the boundaries' and num_accepted_tokens' values; without them
// (traced) the values are left to the bind.
void CheckGivenSlots(const std::string& who, const RecurrentKdaCall& call, const KdaCallShapes& s) {
  const TensorView& idx = call.ssm_state_indices;
  if (idx.data == nullptr || !call.initial_state.present()) return;
  RecurrentKdaArgs a;
  a.N = s.N;
  a.state_indices = static_cast<const int32_t*>(idx.data);
  a.index_cols = idx.ndim == 2 ? idx.shape[1] : 1;  // >= 1 (CheckRecurrentCall)
  a.num_states = s.num_states;
  a.write_slots = call.inplace_final_state;
  if (a.index_cols != 1 || call.num_accepted_tokens.present()) {  // CheckRecurrentSlots reads the boundaries
    if ((call.num_accepted_tokens.present() && call.num_accepted_tokens.data == nullptr) ||
        (call.cu_seqlens.present() && call.cu_seqlens.data == nullptr)) {
      return;
    }
    a.num_accepted_tokens = static_cast<const int32_t*>(call.num_accepted_tokens.data);
    thread_local std::vector<int64_t> cu;
    a.cu_seqlens = BoundariesOf(call, s, cu);
  }
  CheckRecurrentSlots(who, a);
}

KdaCallShapes CheckRecurrentCall(const RecurrentKdaCall& call, bool full) {
  const std::string& who = RecurrentWho(call.entry);
  const ViewChecker c(who, full);
  KdaCallShapes s = CheckTokens(c, call, true, 0);
  const bool vf = call.state_v_first;
  const bool pool = call.ssm_state_indices.present();
  if (pool) {
    const TensorView& idx = call.ssm_state_indices;
    c.Exact(idx, DType::kI32, "ssm_state_indices");
    Check(idx.ndim == 1 || idx.ndim == 2, [&] {
      return who + ": ssm_state_indices: expected shape [N] or [N, C] (a slot per token), got " +
             ShapeString(ShapeOf(idx));
    });
    c.Shape(idx, idx.ndim == 1 ? Dims{s.N} : Dims{s.N, std::max<int64_t>(idx.shape[1], 1)}, "ssm_state_indices",
            idx.ndim == 1 ? "[N]" : "[N, C] with C >= 1");
    c.Layout(idx, "ssm_state_indices");
    c.Present(call.initial_state, "ssm_state_indices", "needs the state pool initial_state [S, HV, K, V]");
  }
  if (call.num_accepted_tokens.present()) {
    Check(pool && call.ssm_state_indices.ndim == 2,
          [&] { return who + ": num_accepted_tokens needs 2-D ssm_state_indices [N, C] (a slot per token)"; });
    c.Exact(call.num_accepted_tokens, DType::kI32, "num_accepted_tokens");
    c.Shape(call.num_accepted_tokens, {s.N}, "num_accepted_tokens", "[N]");
    c.Layout(call.num_accepted_tokens, "num_accepted_tokens");
  }
  if (call.inplace_final_state) {
    // The final states go back into initial_state (absent only in a shape check, a caller learning N).
    if (full) {
      c.Present(call.initial_state, "initial_state",
                "required with inplace_final_state=True (the state pool, or [N, HV, K, V])");
    }
    Check(!call.final_state.present(),
          [&] { return who + ": final_state given with inplace_final_state=True (the states go to initial_state)"; });
  } else {
    if (call.output_final_state && full) {
      c.Present(call.final_state, "final_state",
                pool ? "required with output_final_state (shape [B * T, HV, K, V]: a state per token)"
                     : "required with output_final_state (shape [N, HV, K, V])");
    }
    if (call.final_state.present()) {
      Check(call.output_final_state, [&] { return who + ": final_state given without output_final_state"; });
      CheckStates(c, call.final_state, s, vf, pool ? s.B * s.T : s.N, "final_state", pool ? "B * T" : "N");
    }
  }
  if (call.initial_state.present()) {
    // Any float dtype, as fla's recurrent entries take it (the final states written back in it).
    s.num_states = CheckStates(c, call.initial_state, s, vf, pool ? -1 : s.N, "initial_state", pool ? "S" : "N",
                               /*any_float=*/true);
  }
  if (!pool) s.num_states = 0;
  if (pool && !full) CheckGivenSlots(who, call, s);
  return s;
}

KdaOptions OptionsOf(const KdaCallCommon& call) {
  KdaOptions o;
  o.scale = call.scale.value_or(0.0F);
  o.use_qk_l2norm_in_kernel = call.use_qk_l2norm_in_kernel;
  o.use_gate_in_kernel = call.use_gate_in_kernel;
  if (call.use_gate_in_kernel) {
    o.A_log = call.A_log.present() ? static_cast<const float*>(call.A_log.data) : nullptr;
    o.dt_bias = call.dt_bias.present() ? static_cast<const float*>(call.dt_bias.data) : nullptr;
    o.use_lower_bound = call.lower_bound.has_value();
    o.lower_bound = call.lower_bound.value_or(0.0F);
  }
  o.use_beta_sigmoid_in_kernel = call.use_beta_sigmoid_in_kernel;
  o.beta_scale = call.use_beta_sigmoid_in_kernel && call.allow_neg_eigval ? 2.0F : 1.0F;
  o.delta_correction = call.delta_correction;
  o.D = call.D.present() ? static_cast<const float*>(call.D.data) : nullptr;
  return o;
}

ConstBuf Buf(const TensorView& v) { return {v.data, v.dtype}; }

// Whether a call needs fp32 copies (see NeedsFloat32Copies): q, k and v of several dtypes (the kernels read
// one), or an initial state not fp32.
template <class Call>
bool NeedsCopies(const Call& call) {
  return call.k.dtype != call.q.dtype || call.v.dtype != call.q.dtype ||
         (call.initial_state.present() && call.initial_state.dtype != DType::kF32);
}

// The kernels' arguments hold one dtype for q, k and v and fp32 states: a call in several dtypes runs through
// chunk_kda / fused_recurrent_kda, which make fp32 copies (NeedsFloat32Copies).
template <class Call>
void RefuseMixedBind(const Call& call) {
  CheckDType(!NeedsFloat32Copies(call), [&] {
    return std::string("binding kernel arguments: q, k, v (") + TorchDTypeName(call.q.dtype) + ", " +
           TorchDTypeName(call.k.dtype) + ", " + TorchDTypeName(call.v.dtype) +
           ") and the initial state must have one dtype and float32 here; chunk_kda and fused_recurrent_kda "
           "take such calls (on float32 copies)";
  });
}

// The fields both kernels' arguments share, the boundaries int64 (BoundariesOf: a buffer of the thread's per kind
// of arguments).
template <class Args>
Args BindCommon(const KdaCallCommon& call, const KdaCallShapes& s) {
  Args a;
  SetTokensAndHeads(a, {call.o.data, call.o.dtype}, Buf(call.q), Buf(call.k), Buf(call.v), Buf(call.g), Buf(call.beta),
                    s.H, s.HV, s.K, s.V);
  a.scalar_gate = s.scalar_gate;
  a.token_strides = s.token_strides;
  a.T = s.B * s.T;
  a.N = s.N;
  a.state_v_first = call.state_v_first;
  a.options = OptionsOf(call);
  thread_local std::vector<int64_t> cu;
  a.cu_seqlens = BoundariesOf(call, s, cu);
  return a;
}

}  // namespace

bool ReadsTokensInPlace(const TensorView& v) { return v.ndim != 4 || TokenStrideOf(v) >= 0; }

KdaCallShapes CheckChunkKdaShapes(const ChunkKdaCall& call) { return CheckChunkCall(call, false); }
KdaCallShapes CheckRecurrentKdaShapes(const RecurrentKdaCall& call) { return CheckRecurrentCall(call, false); }

bool NeedsFloat32Copies(const ChunkKdaCall& call) { return NeedsCopies(call); }
bool NeedsFloat32Copies(const RecurrentKdaCall& call) { return NeedsCopies(call); }

void CheckCallToCopy(const ChunkKdaCall& call) { CheckChunkCall(call, true); }
void CheckCallToCopy(const RecurrentKdaCall& call) { CheckRecurrentCall(call, true); }

ChunkKdaArgs BindChunkKda(const ChunkKdaCall& call) {
  const KdaCallShapes s = CheckChunkCall(call, true);
  RefuseMixedBind(call);
  ChunkKdaArgs a = BindCommon<ChunkKdaArgs>(call, s);
  a.final_state = static_cast<float*>(call.final_state.data);
  a.initial_state = static_cast<const float*>(call.initial_state.data);
  if (call.state_indices.present()) {
    a.state = DataOrEmpty<float>(call.state);
    a.state_indices = DataOrEmpty<const int32_t>(call.state_indices);
  }
  a.num_states = s.num_states;
  a.has_initial_state = static_cast<const uint8_t*>(call.has_initial_state.data);
  a.output_final_state = call.state_indices.present() || call.output_final_state;
  a.snapshot_cu = call.snapshot_cu;
  a.snapshot_offsets = call.snapshot_offsets;
  if (call.return_intermediate_states) a.intermediate_states = {call.intermediate_states.data, call.k.dtype};
  a.chunk_size = call.chunk_size;
  a.snapshot_states = call.snapshot_states;   // fp32: the arguments' default snapshot_dtype
  CheckChunkValues(ChunkWho(call.entry), a);  // the structure was checked on the views
  return a;
}

RecurrentKdaArgs BindRecurrentKda(const RecurrentKdaCall& call) {
  const KdaCallShapes s = CheckRecurrentCall(call, true);
  RefuseMixedBind(call);
  RecurrentKdaArgs a = BindCommon<RecurrentKdaArgs>(call, s);
  a.beta_per_value = call.beta.ndim == 4;
  auto* initial = static_cast<float*>(call.initial_state.data);
  if (call.ssm_state_indices.present()) {
    a.state = DataOrEmpty<float>(call.initial_state);
    a.state_indices = DataOrEmpty<const int32_t>(call.ssm_state_indices);
    a.index_cols = call.ssm_state_indices.ndim == 2 ? call.ssm_state_indices.shape[1] : 1;
    a.num_states = s.num_states;
    if (call.num_accepted_tokens.present())
      a.num_accepted_tokens = DataOrEmpty<const int32_t>(call.num_accepted_tokens);
    a.write_slots = call.inplace_final_state;
    if (!call.inplace_final_state && call.output_final_state)
      a.token_states = static_cast<float*>(call.final_state.data);
  } else {
    a.initial_state = initial;
    a.final_state = call.inplace_final_state ? initial : static_cast<float*>(call.final_state.data);
  }
  CheckRecurrentValues(RecurrentWho(call.entry), a);
  return a;
}

}  // namespace kda
