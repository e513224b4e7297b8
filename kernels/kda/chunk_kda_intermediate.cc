// chunk_kda's intermediate states (ChunkKdaArgs::intermediate_states, fla's
// h), shared by the reference and the optimized kernels: chunk 0 of each
// sequence is its initial state, written before the kernel runs (which may
// overwrite that state in place); the later chunks' states are the kernel's
// snapshots at the chunk starts, taken in its one pass over the tokens and
// stored in the buffer's dtype.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/parallel.h"
#include "kda/kernels/kda_args.h"
#include "kernels/kda/kda_common.h"

namespace kda::internal {

IntermediateStates::IntermediateStates(const ChunkKdaArgs& a) : run_(a) {
  const MutBuf h = a.intermediate_states;
  run_.intermediate_states = {};
  run_.snapshot_dtype = h.dtype;
  const int64_t cs = a.chunk_size;
  const size_t seq = static_cast<size_t>(a.HV) * static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
  const size_t row_bytes = seq * DTypeSize(h.dtype);
  auto* const rows = static_cast<char*>(h.data);
  // Sequence n's chunks are rows [first[n], first[n + 1]); its chunks 1.. are snapshots after i * chunk_size of
  // its tokens.
  std::vector<int64_t> first(static_cast<size_t>(a.N) + 1, 0);
  snapshot_cu_.assign(static_cast<size_t>(a.N) + 1, 0);
  for (int64_t n = 0; n < a.N; ++n) {
    const int64_t chunks = (a.cu_seqlens[n + 1] - a.cu_seqlens[n] + cs - 1) / cs;
    first[n + 1] = first[n] + chunks;
    if (!IsPaddingSequence(a, n)) {
      for (int64_t i = 1; i < chunks; ++i) {
        snapshot_offsets_.push_back(i * cs);
        snapshot_states_.push_back(rows + static_cast<size_t>(first[n] + i) * row_bytes);
      }
    }
    snapshot_cu_[static_cast<size_t>(n) + 1] = static_cast<int64_t>(snapshot_offsets_.size());
  }
  run_.snapshot_cu = snapshot_cu_.data();
  run_.snapshot_offsets = snapshot_offsets_.data();
  run_.snapshot_states = snapshot_states_.data();
  // Chunk 0: the initial state rounded once, or zeros; a padding sequence's chunks are all zero. (All-zero bits
  // are 0.0 in F32, BF16 and F16 alike.)
  ParallelFor(a.N, [&](int64_t n) {
    const int64_t chunks = first[n + 1] - first[n];
    if (chunks == 0) return;
    char* row = rows + static_cast<size_t>(first[n]) * row_bytes;
    if (IsPaddingSequence(a, n)) {
      std::memset(row, 0, static_cast<size_t>(chunks) * row_bytes);
      return;
    }
    const float* initial = SequenceInitialState(a, n);
    if (initial == nullptr) {
      std::memset(row, 0, row_bytes);
      return;
    }
    for (size_t i = 0; i < seq; ++i) StoreFromFloat(row, h.dtype, i, initial[i]);
  });
}

}  // namespace kda::internal
