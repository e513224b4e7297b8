// chunk_kda's intermediate states (ChunkKdaArgs::intermediate_states, fla's
// h), shared by the reference and the optimized kernels: chunk 0 of each
// sequence is its initial state, written before the kernel runs (which may
// overwrite that state in place); the later chunks' states are the kernel's
// snapshots at the chunk starts, taken in its one pass over the tokens.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/parallel.h"
#include "kda/kernels/kda_args.h"
#include "kernels/kda/kda_common.h"

namespace kda::internal {

IntermediateStates::IntermediateStates(const ChunkKdaArgs& a) : a_(a), run_(a) {
  run_.intermediate_states = {};
  const int64_t cs = a.chunk_size;
  const size_t seq = static_cast<size_t>(a.HV) * static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
  for (int64_t n = 0; n < a.N; ++n) rows_ += (a.cu_seqlens[n + 1] - a.cu_seqlens[n] + cs - 1) / cs;
  if (a.intermediate_states.dtype == DType::kF32) {
    dst_ = static_cast<float*>(a.intermediate_states.data);
  } else {
    scratch_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(rows_) * seq);
    dst_ = scratch_.get();
  }
  // Sequence n's chunks 1.. are snapshots after i * chunk_size of its tokens.
  snapshot_cu_.assign(static_cast<size_t>(a.N) + 1, 0);
  int64_t row = 0;
  for (int64_t n = 0; n < a.N; ++n) {
    const int64_t len = a.cu_seqlens[n + 1] - a.cu_seqlens[n];
    const int64_t chunks = (len + cs - 1) / cs;
    float* first = dst_ + static_cast<size_t>(row) * seq;
    if (IsPaddingSequence(a, n)) {
      std::fill_n(first, static_cast<size_t>(chunks) * seq, 0.0F);
    } else if (chunks > 0) {
      const float* initial = SequenceInitialState(a, n);
      if (initial != nullptr) {
        std::copy_n(initial, seq, first);
      } else {
        std::fill_n(first, seq, 0.0F);
      }
      for (int64_t i = 1; i < chunks; ++i) {
        snapshot_offsets_.push_back(i * cs);
        snapshot_states_.push_back(first + static_cast<size_t>(i) * seq);
      }
    }
    snapshot_cu_[static_cast<size_t>(n) + 1] = static_cast<int64_t>(snapshot_offsets_.size());
    row += chunks;
  }
  run_.snapshot_cu = snapshot_cu_.data();
  run_.snapshot_offsets = snapshot_offsets_.data();
  run_.snapshot_states = snapshot_states_.data();
}

void IntermediateStates::Finish() const {
  if (scratch_ == nullptr) return;
  // Rounded once from fp32, one chunk row per iteration.
  const size_t seq = static_cast<size_t>(a_.HV) * static_cast<size_t>(a_.K) * static_cast<size_t>(a_.V);
  const MutBuf h = a_.intermediate_states;
  const float* src = dst_;
  ParallelFor(rows_, [&](int64_t r) {
    const size_t base = static_cast<size_t>(r) * seq;
    for (size_t i = 0; i < seq; ++i) StoreFromFloat(h.data, h.dtype, base + i, src[base + i]);
  });
}

}  // namespace kda::internal
