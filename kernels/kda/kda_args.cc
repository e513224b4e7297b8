// Argument checks of the KDA kernels. They run before any output is touched
// and before any parallel loop (the loop bodies must not throw).
#include <algorithm>
#include <cmath>
#include <cstdint>
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
void CheckStateIndices(const std::string& who, const int32_t* indices, int64_t n_entries, int64_t num_states) {
  // (state index, entry) of the non-padding entries; kept per thread so that a
  // steady stream of calls allocates nothing.
  thread_local std::vector<std::pair<int32_t, int64_t>> used;
  used.clear();
  for (int64_t n = 0; n < n_entries; ++n) {
    const int32_t idx = indices[n];
    if (idx < 0) continue;  // padding
    Check(idx < num_states, [&] {
      return who + ": state_indices[" + std::to_string(n) + "] = " + std::to_string(idx) +
             " is out of range for num_states = " + std::to_string(num_states) + " (use a negative index for padding)";
    });
    used.emplace_back(idx, n);
  }
  // Two entries updating one state would race (and the result would depend on the order).
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i) {
    Check(used[i].first != used[i - 1].first, [&] {
      return who + ": duplicate state index " + std::to_string(used[i].first) + " in state_indices[" +
             std::to_string(used[i - 1].second) + "] and state_indices[" + std::to_string(used[i].second) + "]";
    });
  }
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

void ValidateChunkKda(const ChunkKdaArgs& a) {
  static const std::string who = "chunk_kda";  // built once: a good call allocates nothing
  ValidateCommon(who, a.q, a.k, a.v, a.g, a.beta, a.o, a.H, a.K, a.V, a.options);
  Check(a.T >= 0, [&] { return who + ": T must be >= 0, got " + std::to_string(a.T); });
  Check(a.N >= 1, [&] { return who + ": N must be >= 1, got " + std::to_string(a.N); });
  if (a.T > 0) CheckTokenBuffers(who, a.q, a.k, a.v, a.g, a.beta, a.o);
  Check(a.cu_seqlens != nullptr, [&] { return who + ": cu_seqlens is null"; });
  Check(a.cu_seqlens[0] == 0,
        [&] { return who + ": cu_seqlens[0] must be 0, got " + std::to_string(a.cu_seqlens[0]); });
  for (int64_t n = 0; n < a.N; ++n) {
    Check(a.cu_seqlens[n + 1] >= a.cu_seqlens[n], [&] {
      return who + ": cu_seqlens must be non-decreasing, but cu_seqlens[" + std::to_string(n + 1) +
             "] = " + std::to_string(a.cu_seqlens[n + 1]) + " < cu_seqlens[" + std::to_string(n) +
             "] = " + std::to_string(a.cu_seqlens[n]);
    });
  }
  Check(a.cu_seqlens[a.N] == a.T, [&] {
    return who + ": cu_seqlens[N] must equal T, got " + std::to_string(a.cu_seqlens[a.N]) +
           " with T = " + std::to_string(a.T);
  });
  CheckSnapshots(who, a);
  if (a.state_indices != nullptr) {
    Check(a.initial_state == nullptr && a.final_state == nullptr,
          [&] { return who + ": state_indices (pool form) excludes initial_state and final_state"; });
    Check(a.state != nullptr, [&] { return who + ": state_indices given but state is null"; });
    Check(a.num_states >= 0, [&] { return who + ": num_states must be >= 0, got " + std::to_string(a.num_states); });
    CheckStateIndices(who, a.state_indices, a.N, a.num_states);
    return;
  }
  Check(a.state == nullptr, [&] { return who + ": state (pool form) requires state_indices"; });
  Check(!a.output_final_state || a.final_state != nullptr,
        [&] { return who + ": output_final_state requires final_state"; });
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

void ValidateRecurrentKda(const RecurrentKdaArgs& a) {
  static const std::string who = "fused_recurrent_kda";
  ValidateCommon(who, a.q, a.k, a.v, a.g, a.beta, a.o, a.H, a.K, a.V, a.options);
  Check(a.N >= 0, [&] { return who + ": N must be >= 0, got " + std::to_string(a.N); });
  Check(a.num_states >= 0, [&] { return who + ": num_states must be >= 0, got " + std::to_string(a.num_states); });
  if (a.N == 0) return;
  CheckTokenBuffers(who, a.q, a.k, a.v, a.g, a.beta, a.o);
  Check(a.state != nullptr, [&] { return who + ": state is null"; });
  Check(a.state_indices != nullptr, [&] { return who + ": state_indices is null"; });
  CheckStateIndices(who, a.state_indices, a.N, a.num_states);
}

}  // namespace kda
