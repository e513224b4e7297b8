// The attention backend of linear recurrent layers (design §4),
// LinearRecurrentAttnBackend (layers/attention/linear/linear_recurrent_backend.cc):
// the part a KDA, GDN or Mamba2 backend shares: per-batch metadata computed
// once and read by every layer, the layer check, forward-mode dispatch, the
// short conv with its pool tails and snapshots, and the pool's states as the
// kernels take them (CoreStep). A subclass only binds its kernels: RunExtend
// and RunDecode (KDAAttnBackend, kda_backend.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
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
  std::vector<int32_t> recurrent_indices;  // [N] pool slots (the batch's req_pool_indices, checked)
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

  // kda::Error unless the layer fits the pool (a pool layer of its index, its
  // heads, head dims and conv width). A ModelRunner checks each of its layers
  // once, when it is made; Forward checks a layer the first time it sees it.
  void CheckLayer(const RadixLinearAttention& layer) const;

  // One layer's attention core for the current batch (see RadixLinearAttention::Forward).
  void Forward(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
               ConstBuf beta_logits);

  // One layer's step as the kernels take it: the batch's tokens after the
  // short conv, the layer's raw gate inputs, and its recurrent states in the
  // pool, read and written in place through the slots.
  struct CoreStep {
    const RadixLinearAttention& layer;
    MutBuf o;                        // [T, H, V]
    ConstBuf q, k, v;                // [T, H, K], [T, H, K], [T, H, V] after conv + SiLU
    ConstBuf gate_raw, beta_logits;  // the layer's projections, as Forward got them
    int64_t num_tokens = 0;          // T
    int64_t num_seqs = 0;            // N
    MutTensorView state;             // [S, H, K, V] fp32, the layer's pool states
    TensorView state_indices;        // [N] int32 slots
    TensorView has_initial_state;    // [N] uint8; in DECODE the fresh slots are already zeroed
    TensorView cu_seqlens;           // [N + 1] int64 (EXTEND)
    // EXTEND with snapshots: this layer's part of each (see ChunkKdaArgs); else null.
    const int64_t* snapshot_cu = nullptr;
    const int64_t* snapshot_offsets = nullptr;
    float* const* snapshot_states = nullptr;
  };

 protected:
  virtual void RunExtend(const CoreStep& step) = 0;  // prefill: the chunked kernel
  virtual void RunDecode(const CoreStep& step) = 0;  // one token per sequence: the recurrent kernel

  // Shows the observer (if any) one of the layer's tensors.
  void Report(int layer_id, LayerTensor which, ConstBuf values, int64_t count) const {
    if (observer_ != nullptr) observer_->OnTensor(layer_id, which, values, count);
  }

 private:
  void ForwardExtendOrDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                             ConstBuf beta_logits);
  // q, k, v [T, P] after conv + SiLU, in the activation dtype.
  struct ConvOutputs {
    MutBuf q, k, v;
  };
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
  std::vector<const RadixLinearAttention*> checked_;  // [layer id] the layer CheckLayer passed
  std::vector<float*> layer_snapshots_;               // this layer's part of each snapshot (reused)
};

}  // namespace kda
