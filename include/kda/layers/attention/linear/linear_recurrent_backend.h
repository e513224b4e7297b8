// The attention backend of linear recurrent layers (design §4),
// LinearRecurrentAttnBackend (layers/attention/linear/linear_recurrent_backend.cc):
// the part a KDA, GDN or Mamba2 backend shares. Per-batch metadata computed
// once and read by every layer, forward-mode dispatch, the short conv with its
// pool tails. A subclass binds its kernels (KDAAttnBackend, kda_backend.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"

namespace kda {

class RadixLinearAttention;

// Computed once per batch, shared by all layers.
struct LinearAttnMetadata {
  ForwardMode mode = ForwardMode::kIdle;
  int64_t num_tokens = 0;
  std::vector<int64_t> cu_q_lens;          // [N + 1]
  std::vector<int32_t> recurrent_indices;  // [N] pool slots
  std::vector<uint8_t> has_initial_state;  // [N] prefix_len > 0 (or a seeded slot)
  // State snapshots of this EXTEND batch (see ForwardBatch); empty cu: none.
  std::vector<int64_t> snapshot_cu;
  std::vector<int64_t> snapshot_offsets;
  std::vector<float*> snapshot_recurrent;
  std::vector<uint8_t*> snapshot_conv;
};

class LinearRecurrentAttnBackend {
 public:
  explicit LinearRecurrentAttnBackend(MemoryPools pools);
  virtual ~LinearRecurrentAttnBackend() = default;
  LinearRecurrentAttnBackend(const LinearRecurrentAttnBackend&) = delete;
  LinearRecurrentAttnBackend& operator=(const LinearRecurrentAttnBackend&) = delete;

  // Validates the batch (mode supported, every request holds a slot, lengths
  // consistent with the mode) and computes the metadata. kda::Error on bad
  // input, with the previous metadata kept.
  void InitForwardMetadata(const ForwardBatch& batch);
  const LinearAttnMetadata& metadata() const { return md_; }

  // Shown every batch and the tensors of every layer from now on (null: off).
  // Not owned; it must outlive its use.
  void SetObserver(LayerObserver* observer) { observer_ = observer; }
  LayerObserver* observer() const { return observer_; }

  // One layer's attention core for the current batch (see RadixLinearAttention::Forward).
  void Forward(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
               ConstBuf beta_logits);

 protected:
  // q, k, v [T, P] after conv + SiLU, in the activation dtype.
  struct ConvOutputs {
    MutBuf q, k, v;
  };
  virtual void ForwardExtend(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                             ConstBuf beta_logits) = 0;
  virtual void ForwardDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                             ConstBuf beta_logits) = 0;

  // The q/k/v short convs + SiLU over the batch, tails read from and written
  // to the layer's pool slots (zero tails where has_initial_state is 0).
  void RunShortConv(const RadixLinearAttention& layer, ConstBuf mixed_qkv, const ConvOutputs& out);
  // The conv tails of the batch's snapshots for this layer: the last W-1 conv
  // inputs before each snapshot offset, from mixed_qkv and (before the
  // sequence's first row) its slot's tail. Runs before RunShortConv moves the tails.
  void SnapshotConvTails(const RadixLinearAttention& layer, ConstBuf mixed_qkv);
  LayerStateCache Cache(int layer_id) const;

  MemoryPools pools_;
  LinearAttnMetadata md_;
  LayerObserver* observer_ = nullptr;
};

}  // namespace kda
