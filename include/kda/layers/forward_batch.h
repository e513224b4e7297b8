// One forward step's batch as the scheduler hands it to the model runner, and
// the LayerObserver shown the step's tensors.
//
// LayerObserver: read-only access to the tensors of a forward pass, for
// traces, self-checks and golden tests. Set on the attention backend (or a
// ModelRunner, which sets it on its backend); the layers and the backend show
// it their tensors as they are computed. No observer: nothing is copied.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"

namespace kda {

// EXTEND: prefill and chunked-prefill continuation (packed varlen) -> chunk
// kernel. DECODE: one token per request -> recurrent kernel. IDLE: no tokens
// (a data-parallel rank with nothing to do) -> zeros, no state touched.
// TARGET_VERIFY: each request's next input plus k >= 0 draft rows, every
// position computed from the committed states, then a commit of the kept
// positions (ModelRunner::CommitVerify, docs/speculative.md). DRAFT_EXTEND and
// MIXED are refused for KDA.
enum class ForwardMode : uint8_t { kExtend, kDecode, kIdle, kMixed, kDraftExtend, kTargetVerify };

const char* ForwardModeName(ForwardMode mode);

struct ForwardBatch {
  ForwardMode mode = ForwardMode::kExtend;
  std::vector<int64_t> req_ids;  // [N] requests, each holding a state slot
  // [N] each request's state slot (HybridReqToTokenPool::Alloc's), resolved
  // once by whoever builds the batch (sglang's req_pool_indices).
  std::vector<int32_t> req_pool_indices;
  std::vector<int64_t> extend_lens;  // [N] tokens of each request in this step (1 in DECODE, 1 + k in TARGET_VERIFY)
  std::vector<int64_t> prefix_lens;  // [N] tokens of each request processed before this step
  // [N] or empty: the request's slot was seeded with an initial state before
  // its first step, so it continues from it even at prefix 0.
  std::vector<uint8_t> state_seeded;
  // EXTEND only, optional (prefix caching): request i's states after
  // snapshot_offsets[j] of its tokens in this step, j in [snapshot_cu[i],
  // snapshot_cu[i+1]), go to snapshot j's storage, recurrent [L, H, K, V] fp32
  // and conv tails [L, W-1, 3P] in the conv dtype (RadixStateCache::Snapshot).
  // Offsets as chunk_kda's (multiples of 64 or the request's extend length).
  // Empty snapshot_cu: none.
  std::vector<int64_t> snapshot_cu;        // [N + 1] or empty
  std::vector<int64_t> snapshot_offsets;   // [S]
  std::vector<float*> snapshot_recurrent;  // [S]
  std::vector<uint8_t*> snapshot_conv;     // [S]

  int64_t num_tokens() const {
    int64_t t = 0;
    for (int64_t l : extend_lens) t += l;
    return t;
  }
};

// Where a request's tokens sit among a batch's packed tokens: rows
// [begin, begin + rows) (rows 0 when the request is not in the batch).
struct BatchRows {
  int64_t begin = 0;
  int64_t rows = 0;
};
BatchRows RowsOf(const ForwardBatch& batch, int64_t req_id);

// The tensors of one KDA layer's forward pass, T tokens of the batch, P = H*K.
// In the activation dtype unless marked fp32.
enum class LayerTensor : uint8_t {
  kInput,       // [T, hidden] the layer's input
  kQConv,       // [T, H, K] q after the short conv + SiLU
  kKConv,       // [T, H, K] k after the short conv + SiLU
  kVConv,       // [T, H, V] v after the short conv + SiLU
  kGateRaw,     // [T, H, K] f_b_proj output (before dt_bias)
  kGate,        // [T, H, K] fp32 log decay g
  kBeta,        // [T, H] fp32 beta
  kCoreOutput,  // [T, H, V] the KDA kernel's output
  kOutputGate,  // [T, H, V] g_b_proj output (the gated RMSNorm's gate)
  kOutput,      // [T, hidden] the layer's output
};

class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // A batch's metadata was set (before any of its layers runs).
  virtual void OnBatch(const ForwardBatch& /*batch*/) {}
  // Layer `layer_id` (its pool layer index) computed `which`: `count` values
  // of `values.dtype`, readable only during the call.
  virtual void OnTensor(int layer_id, LayerTensor which, ConstBuf values, int64_t count) = 0;
};

}  // namespace kda
