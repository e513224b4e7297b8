#include "kda/layers/attention/linear/linear_recurrent_backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/short_conv.h"
#include "kda/layers/radix_linear_attention.h"

namespace kda {

LinearRecurrentAttnBackend::LinearRecurrentAttnBackend(MemoryPools pools) : pools_(pools) {
  Check(pools.state_pool != nullptr && pools.req_to_token_pool != nullptr, "attention backend: missing memory pools");
}

void LinearRecurrentAttnBackend::InitForwardMetadata(const ForwardBatch& batch) {
  const ForwardMode mode = batch.mode;
  Check(mode == ForwardMode::kExtend || mode == ForwardMode::kDecode || mode == ForwardMode::kIdle,
        std::string("forward mode ") + ForwardModeName(mode) + " is not supported by the KDA backend");
  const size_t n = batch.req_ids.size();
  Check(batch.extend_lens.size() == n && batch.prefix_lens.size() == n && batch.req_pool_indices.size() == n,
        "forward batch: req_ids, req_pool_indices, extend_lens and prefix_lens must have one entry per request");
  Check(batch.state_seeded.empty() || batch.state_seeded.size() == n,
        "forward batch: state_seeded must be empty or have one entry per request");
  if (mode == ForwardMode::kIdle) {
    Check(n == 0, "forward batch: an IDLE batch has no requests");
  } else {
    Check(n >= 1, std::string("forward batch: an ") + ForwardModeName(mode) + " batch needs at least one request");
  }
  LinearAttnMetadata md;
  md.mode = mode;
  md.cu_q_lens.assign(1, 0);
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < n; ++i) {
    const int64_t req = batch.req_ids[i];
    Check(seen.insert(req).second, "forward batch: request " + std::to_string(req) + " appears twice");
    Check(batch.extend_lens[i] >= 0 && batch.prefix_lens[i] >= 0, "forward batch: negative length");
    Check(mode != ForwardMode::kDecode || batch.extend_lens[i] == 1,
          "forward batch: a DECODE batch has exactly one token per request");
    md.cu_q_lens.push_back(md.cu_q_lens.back() + batch.extend_lens[i]);
    const int32_t slot = batch.req_pool_indices[i];
    Check(pools_.req_to_token_pool->Holds(req, slot), [&] {
      return "forward batch: request " + std::to_string(req) + " does not hold state slot " + std::to_string(slot);
    });
    md.recurrent_indices.push_back(slot);
    const bool seeded = !batch.state_seeded.empty() && batch.state_seeded[i] != 0;
    md.has_initial_state.push_back(batch.prefix_lens[i] > 0 || seeded ? 1 : 0);
  }
  md.num_tokens = md.cu_q_lens.back();
  if (!batch.snapshot_cu.empty()) {
    Check(mode == ForwardMode::kExtend, "forward batch: state snapshots are taken in EXTEND batches only");
    Check(batch.snapshot_cu.size() == n + 1 && batch.snapshot_cu[0] == 0,
          "forward batch: snapshot_cu must have one entry per request plus one, starting at 0");
    const auto s = static_cast<size_t>(batch.snapshot_cu[n]);
    Check(batch.snapshot_offsets.size() == s && batch.snapshot_recurrent.size() == s && batch.snapshot_conv.size() == s,
          "forward batch: snapshot_offsets, snapshot_recurrent and snapshot_conv must have one entry per snapshot");
    for (size_t i = 0; i < n; ++i) {
      Check(batch.snapshot_cu[i + 1] >= batch.snapshot_cu[i], "forward batch: snapshot_cu must be non-decreasing");
      int64_t prev = 0;
      for (int64_t j = batch.snapshot_cu[i]; j < batch.snapshot_cu[i + 1]; ++j) {
        const int64_t off = batch.snapshot_offsets[j];
        const int64_t len = batch.extend_lens[i];
        Check(off > prev && off <= len && (off % kSnapshotAlign == 0 || off == len),
              "forward batch: snapshot offset " + std::to_string(off) + " of request " +
                  std::to_string(batch.req_ids[i]) + " must increase and be a multiple of " +
                  std::to_string(kSnapshotAlign) + " in (0, " + std::to_string(len) + "] or its extend length");
        Check(batch.snapshot_recurrent[j] != nullptr && batch.snapshot_conv[j] != nullptr,
              "forward batch: null snapshot storage");
        prev = off;
      }
    }
    md.snapshot_cu = batch.snapshot_cu;
    md.snapshot_offsets = batch.snapshot_offsets;
    md.snapshot_recurrent = batch.snapshot_recurrent;
    md.snapshot_conv = batch.snapshot_conv;
  }
  md_ = std::move(md);
  if (observer_ != nullptr) observer_->OnBatch(batch);
}

void LinearRecurrentAttnBackend::CheckLayer(const RadixLinearAttention& layer) const {
  const RecurrentStatePool& pool = *pools_.state_pool;
  Check(layer.layer_id() >= 0 && layer.layer_id() < pool.num_layers(), [&] {
    return "attention backend: layer " + std::to_string(layer.layer_id()) + " has no state in the pool (" +
           std::to_string(pool.num_layers()) + " layers)";
  });
  Check(layer.num_heads() == pool.shape().H && layer.head_k_dim() == pool.shape().K &&
            layer.head_v_dim() == pool.shape().K && layer.conv_width() == pool.shape().W,
        "attention backend: the layer's heads, head dims or conv width differ from the pool's");
}

void LinearRecurrentAttnBackend::Forward(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv,
                                         ConstBuf gate_raw, ConstBuf beta_logits) {
  const auto id = static_cast<size_t>(std::max(layer.layer_id(), 0));
  if (id >= checked_.size() || checked_[id] != &layer) {
    CheckLayer(layer);  // once per layer, not per step
    if (id >= checked_.size()) checked_.resize(id + 1, nullptr);
    checked_[id] = &layer;
  }
  const DType conv_dtype = pools_.state_pool->conv_dtype();
  Check(mixed_qkv.dtype == conv_dtype && gate_raw.dtype == mixed_qkv.dtype && beta_logits.dtype == mixed_qkv.dtype &&
            o.dtype == mixed_qkv.dtype,
        [&] {
          return std::string("attention backend: activations must be ") + DTypeName(conv_dtype) +
                 ", the pool's conv dtype";
        });
  switch (md_.mode) {
    case ForwardMode::kExtend:
    case ForwardMode::kDecode:
      ForwardExtendOrDecode(layer, o, mixed_qkv, gate_raw, beta_logits);
      return;
    case ForwardMode::kIdle:
      return;  // no tokens: nothing to write, no state touched
    default:
      throw Error(std::string("forward mode ") + ForwardModeName(md_.mode) + " is not supported by the KDA backend");
  }
}

void LinearRecurrentAttnBackend::ForwardExtendOrDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv,
                                                       ConstBuf gate_raw, ConstBuf beta_logits) {
  const bool extend = md_.mode == ForwardMode::kExtend;
  if (extend) SnapshotConvTails(layer, mixed_qkv);  // before the conv moves the slots' tails
  const int64_t T = md_.num_tokens;
  const int64_t p = layer.projection_size();
  ActBuffer q = ActBuffer::Uninitialized(mixed_qkv.dtype, T * p);
  ActBuffer k = ActBuffer::Uninitialized(mixed_qkv.dtype, T * p);
  ActBuffer v = ActBuffer::Uninitialized(mixed_qkv.dtype, T * p);
  RunShortConv(layer, mixed_qkv, {q.mut(), k.mut(), v.mut()});

  const LayerStateCache cache = Cache(layer.layer_id());
  const auto N = static_cast<int64_t>(md_.recurrent_indices.size());
  const int64_t H = layer.num_heads();
  CoreStep step{
      .layer = layer,
      .o = o,
      .q = q.view(),
      .k = k.view(),
      .v = v.view(),
      .gate_raw = gate_raw,
      .beta_logits = beta_logits,
      .num_tokens = T,
      .num_seqs = N,
      .state = ContiguousView<void*>(cache.recurrent, DType::kF32,
                                     {cache.num_slots, H, layer.head_k_dim(), layer.head_v_dim()}),
      .state_indices = ContiguousView<const void*>(md_.recurrent_indices.data(), DType::kI32, {N}),
      .has_initial_state = ContiguousView<const void*>(md_.has_initial_state.data(), DType::kU8, {N}),
      .cu_seqlens = ContiguousView<const void*>(md_.cu_q_lens.data(), DType::kI64, {N + 1}),
  };
  const int64_t rs = pools_.state_pool->shape().RecurrentStateSize();
  if (extend) {
    if (!md_.snapshot_cu.empty()) {
      layer_snapshots_.clear();
      for (float* s : md_.snapshot_recurrent) layer_snapshots_.push_back(s + layer.layer_id() * rs);
      step.snapshot_cu = md_.snapshot_cu.data();
      step.snapshot_offsets = md_.snapshot_offsets.data();
      step.snapshot_states = layer_snapshots_.data();
    }
    RunExtend(step);
  } else {
    // A fresh request's slot is cleared here, so that every decode kernel may read its state.
    for (int64_t n = 0; n < N; ++n) {
      if (md_.has_initial_state[n] == 0) std::fill_n(cache.recurrent + md_.recurrent_indices[n] * rs, rs, 0.0F);
    }
    RunDecode(step);
  }
  if (observer_ != nullptr) {
    const int id = layer.layer_id();
    Report(id, LayerTensor::kQConv, q.view(), q.size());
    Report(id, LayerTensor::kKConv, k.view(), k.size());
    Report(id, LayerTensor::kVConv, v.view(), v.size());
    Report(id, LayerTensor::kCoreOutput, {o.data, o.dtype}, T * H * layer.head_v_dim());
  }
}

LayerStateCache LinearRecurrentAttnBackend::Cache(int layer_id) const {
  return pools_.state_pool->GetLayerCache(layer_id);
}

void LinearRecurrentAttnBackend::RunShortConv(const RadixLinearAttention& layer, ConstBuf mixed_qkv,
                                              const ConvOutputs& out) {
  const LayerStateCache cache = Cache(layer.layer_id());
  const int64_t p = layer.projection_size();
  const int W = layer.conv_width();
  const MutBuf outs[3] = {out.q, out.k, out.v};
  for (int group = 0; group < 3; ++group) {
    ShortConvArgs a;
    a.y = outs[group];
    a.x = Offset(mixed_qkv, group * p);
    a.x_row_stride = 3 * p;
    a.weight = layer.conv_weight().data() + group * W * p;  // [3][W][P]: this group's [W, P]
    a.cu_seqlens = md_.cu_q_lens.data();
    a.N = static_cast<int64_t>(md_.recurrent_indices.size());
    a.T = md_.num_tokens;
    a.C = p;
    a.W = W;
    a.tails = Offset(MutBuf{cache.conv, cache.conv_dtype}, group * p);
    a.tail_row_stride = 3 * p;
    a.num_tails = cache.num_slots;
    a.tail_indices = md_.recurrent_indices.data();
    a.has_initial_state = md_.has_initial_state.data();
    short_conv_silu(a);
  }
}

void LinearRecurrentAttnBackend::SnapshotConvTails(const RadixLinearAttention& layer, ConstBuf mixed_qkv) {
  if (md_.snapshot_cu.empty()) return;
  const LayerStateCache cache = Cache(layer.layer_id());
  const int64_t tail_rows = layer.conv_width() - 1;
  const size_t row = static_cast<size_t>(3 * layer.projection_size()) * DTypeSize(cache.conv_dtype);
  const size_t tail_bytes = static_cast<size_t>(tail_rows) * row;
  const auto* x = static_cast<const uint8_t*>(mixed_qkv.data);
  const auto* tails = static_cast<const uint8_t*>(cache.conv);
  for (size_t n = 0; n + 1 < md_.snapshot_cu.size(); ++n) {
    for (int64_t j = md_.snapshot_cu[n]; j < md_.snapshot_cu[n + 1]; ++j) {
      uint8_t* dst = md_.snapshot_conv[j] + static_cast<size_t>(layer.layer_id()) * tail_bytes;
      for (int64_t r = 0; r < tail_rows; ++r) {
        const int64_t src = md_.snapshot_offsets[j] - tail_rows + r;  // row of the sequence in this batch
        if (src >= 0) {
          std::memcpy(dst + r * row, x + static_cast<size_t>(md_.cu_q_lens[n] + src) * row, row);
        } else if (md_.has_initial_state[n] != 0) {
          const size_t slot = static_cast<size_t>(md_.recurrent_indices[n]);
          std::memcpy(dst + r * row, tails + slot * tail_bytes + static_cast<size_t>(tail_rows + src) * row, row);
        } else {
          std::memset(dst + r * row, 0, row);  // a fresh sequence's tail starts as zeros (+0.0 in F32 and BF16)
        }
      }
    }
  }
}

}  // namespace kda
