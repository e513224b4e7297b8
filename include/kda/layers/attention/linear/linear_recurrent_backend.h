// The attention backend of linear recurrent layers (design §4),
// LinearRecurrentAttnBackend (layers/attention/linear/linear_recurrent_backend.cc):
// the part a KDA, GDN or Mamba2 backend shares: per-batch metadata computed
// once and read by every layer, the layer check, forward-mode dispatch, the
// short conv with its pool tails and snapshots, and the pool's states as the
// kernels take them (CoreStep), for every layer geometry (DeltaRuleGeometry:
// grouped value heads, K != V, both decay widths). A subclass only binds its
// kernels: RunExtend, RunDecode, RunVerify and RunCommit (DeltaRuleAttnBackend,
// delta_rule_backend.h).
//
// TARGET_VERIFY (speculative decoding, docs/speculative.md): request n's
// extend_lens[n] = 1 + k_n positions (its next input and k_n drafts, k_n up to
// the pool's max_draft_tokens, 0 allowed) are computed in one step from its
// committed state and conv tail, which the step leaves as they are; what a
// commit needs goes to the slot's verify area. The runner then marks the
// positions pending (EndVerify); a commit keeps the first a + 1 of them
// (InitCommit, CommitLayer per layer, EndCommit) so that the slot holds the
// state after exactly those. A slot with a pending verify takes no other
// batch until its commit.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"

namespace kda {

class ActBuffer;
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

  // kda::Error unless the layer fits the pool (a pool layer of its index and
  // its state spec). A ModelRunner checks each of its layers
  // once, when it is made; Forward checks a layer the first time it sees it.
  void CheckLayer(const RadixLinearAttention& layer) const;

  // One layer's attention core for the current batch: o [T, HV, V] from the
  // step's projections, mixed_qkv [T, C] (before the conv, C =
  // geometry.conv_channels()), gate_raw [T, gate_width] (before dt_bias),
  // beta_logits [T, HV], all in the activation dtype; the metadata describes
  // the batch.
  void Forward(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
               ConstBuf beta_logits);

  // After every layer ran the current TARGET_VERIFY batch: its positions are
  // pending in the pool until their commit. No-op in other modes.
  void EndVerify();
  // Commit of pending verify steps: request req_ids[i] keeps the first
  // keep[i] positions of its last verify step (0 <= keep[i] <= its pending
  // count; 0 keeps none). InitCommit checks (kda::Error, nothing written);
  // CommitLayer then moves each layer's slot states (recurrent state and conv
  // tail) past the kept positions; EndCommit clears the pending counts.
  void InitCommit(const std::vector<int64_t>& req_ids, const std::vector<int64_t>& keep);
  void CommitLayer(const RadixLinearAttention& layer);
  void EndCommit();

  // One layer's step as the kernels take it: the batch's tokens after the
  // short conv, the layer's raw gate inputs, and its recurrent states in the
  // pool, read and written in place through the slots.
  struct CoreStep {
    const RadixLinearAttention& layer;
    MutBuf o;                        // [T, HV, V]
    ConstBuf q, k, v;                // [T, H, K], [T, H, K], [T, HV, V] after conv + SiLU
    ConstBuf gate_raw, beta_logits;  // the layer's projections, as Forward got them
    int64_t num_tokens = 0;          // T
    int64_t num_seqs = 0;            // N
    MutTensorView state;             // [S, HV, K, V] fp32, the layer's pool states
    TensorView state_indices;        // [N] int32 slots
    TensorView has_initial_state;    // [N] uint8; in DECODE the fresh slots are already zeroed
    TensorView cu_seqlens;           // [N + 1] int64 (EXTEND)
    // EXTEND with snapshots: this layer's part of each (see ChunkKdaArgs); else null.
    const int64_t* snapshot_cu = nullptr;
    const int64_t* snapshot_offsets = nullptr;
    void* const* snapshot_states = nullptr;  // fp32 destinations
    // TARGET_VERIFY with VerifyMethod::kTokenStates: [N] where sequence n's
    // state after each of its tokens goes ([len_n, HV, K, V]); else null.
    float* const* token_states = nullptr;
  };

 protected:
  virtual void RunExtend(const CoreStep& step) = 0;  // prefill: the chunked kernel
  virtual void RunDecode(const CoreStep& step) = 0;  // one token per sequence: the recurrent kernel
  // TARGET_VERIFY: every sequence's tokens (cu_seqlens) from its slot's state,
  // the slots only read; with token_states the state after each token there.
  virtual void RunVerify(const CoreStep& step) = 0;
  // Commit: every sequence's kept tokens (cu_seqlens) from its slot's state,
  // the state after them written back to the slot; o is scratch.
  virtual void RunCommit(const CoreStep& step) = 0;

  // Shows the observer (if any) one of the layer's tensors.
  void Report(int layer_id, LayerTensor which, ConstBuf values, int64_t count) const {
    if (observer_ != nullptr) observer_->OnTensor(layer_id, which, values, count);
  }

 private:
  void ForwardExtendOrDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                             ConstBuf beta_logits);
  void ForwardVerify(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                     ConstBuf beta_logits);
  // q, k [T, H*K] and v [T, HV*V] after conv + SiLU, in the activation dtype.
  struct ConvOutputs {
    MutBuf q, k, v;
  };
  // The sequences of a short conv and their tails: rows [W-1, C] of `tails`
  // (num_tails of them), read and written in place.
  struct ConvSeqs {
    MutBuf tails;
    int64_t num_tails = 0;
    const int32_t* indices = nullptr;            // [N]
    const uint8_t* has_initial_state = nullptr;  // [N] (0: zero tail)
    const int64_t* cu = nullptr;                 // [N + 1]
    int64_t N = 0;
    int64_t T = 0;
  };
  // The q/k/v short convs + SiLU over `seqs`.
  void RunShortConv(const RadixLinearAttention& layer, ConstBuf mixed_qkv, const ConvOutputs& out,
                    const ConvSeqs& seqs);
  // The batch's sequences with their tails in the layer's pool slots.
  ConvSeqs PoolConvSeqs(const LayerStateCache& cache) const;
  // The conv tails of the batch's snapshots for this layer: the last W-1 conv
  // inputs before each snapshot offset, from mixed_qkv and (before the
  // sequence's first row) its slot's tail. Runs before RunShortConv moves the tails.
  void SnapshotConvTails(const RadixLinearAttention& layer, ConstBuf mixed_qkv);
  LayerStateCache Cache(int layer_id) const;
  // Shows the observer (if any) the step's conv outputs and core output.
  void ReportCore(const RadixLinearAttention& layer, const ActBuffer& q, const ActBuffer& k, const ActBuffer& v,
                  MutBuf o) const;

  MemoryPools pools_;
  LinearAttnMetadata md_;
  LayerObserver* observer_ = nullptr;
  std::vector<const RadixLinearAttention*> checked_;  // [layer id] the layer CheckLayer passed
  std::vector<void*> layer_snapshots_;                // this layer's part of each snapshot (reused)
  // The commit between InitCommit and EndCommit: the requests keeping at least one position.
  struct CommitMetadata {
    std::vector<int32_t> slots;      // [Nc]
    std::vector<int64_t> keep;       // [Nc] >= 1
    std::vector<int64_t> cu;         // [Nc + 1] over the kept positions
    std::vector<int32_t> all_slots;  // every named request's slot (its pending count cleared at EndCommit)
  };
  CommitMetadata commit_;
};

}  // namespace kda
