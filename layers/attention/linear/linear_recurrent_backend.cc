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
  Check(mode == ForwardMode::kExtend || mode == ForwardMode::kDecode || mode == ForwardMode::kIdle ||
            mode == ForwardMode::kTargetVerify,
        std::string("forward mode ") + ForwardModeName(mode) + " is not supported by the delta-rule backend");
  const RecurrentStatePool& pool = *pools_.state_pool;
  const int64_t verify_rows = pool.verify().rows();
  Check(mode != ForwardMode::kTargetVerify || verify_rows > 0,
        "forward batch: TARGET_VERIFY needs a state pool with a verify area (VerifyConfig::max_draft_tokens > 0)");
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
    Check(mode != ForwardMode::kTargetVerify || (batch.extend_lens[i] >= 1 && batch.extend_lens[i] <= verify_rows),
          [&] {
            return "forward batch: request " + std::to_string(req) + " has " + std::to_string(batch.extend_lens[i]) +
                   " verify positions; a TARGET_VERIFY batch holds 1 + k per request, k in [0, " +
                   std::to_string(verify_rows - 1) + "] (the pool's max_draft_tokens)";
          });
    md.cu_q_lens.push_back(md.cu_q_lens.back() + batch.extend_lens[i]);
    const int32_t slot = batch.req_pool_indices[i];
    Check(pools_.req_to_token_pool->Holds(req, slot), [&] {
      return "forward batch: request " + std::to_string(req) + " does not hold state slot " + std::to_string(slot);
    });
    Check(pool.pending_verify(slot) == 0, [&] {
      return "forward batch: request " + std::to_string(req) + " has a verify step waiting for its commit";
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
  Check(layer.geometry().state_spec() == pool.spec(),
        "attention backend: the layer's heads, head dims, conv channels or conv width differ from the pool's");
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
    case ForwardMode::kTargetVerify:
      ForwardVerify(layer, o, mixed_qkv, gate_raw, beta_logits);
      return;
    case ForwardMode::kIdle:
      return;  // no tokens: nothing to write, no state touched
    default:
      throw Error(std::string("forward mode ") + ForwardModeName(md_.mode) +
                  " is not supported by the delta-rule backend");
  }
}

namespace {

// A step of N sequences (cu [N + 1], T tokens) over the layer's pool states in `slots`.
LinearRecurrentAttnBackend::CoreStep StepOver(const RadixLinearAttention& layer, const LayerStateCache& cache, MutBuf o,
                                              const ActBuffer& q, const ActBuffer& k, const ActBuffer& v,
                                              ConstBuf gate_raw, ConstBuf beta_logits, int64_t T, int64_t N,
                                              const int32_t* slots, const uint8_t* has_initial_state,
                                              const int64_t* cu) {
  return {
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
                                     {cache.num_slots, layer.geometry().HV, layer.geometry().K, layer.geometry().V}),
      .state_indices = ContiguousView<const void*>(slots, DType::kI32, {N}),
      .has_initial_state = ContiguousView<const void*>(has_initial_state, DType::kU8, {N}),
      .cu_seqlens = ContiguousView<const void*>(cu, DType::kI64, {N + 1}),
  };
}

}  // namespace

void LinearRecurrentAttnBackend::ForwardExtendOrDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv,
                                                       ConstBuf gate_raw, ConstBuf beta_logits) {
  const bool extend = md_.mode == ForwardMode::kExtend;
  if (extend) SnapshotConvTails(layer, mixed_qkv);  // before the conv moves the slots' tails
  const int64_t T = md_.num_tokens;
  const DeltaRuleGeometry& geo = layer.geometry();
  ActBuffer q = ActBuffer::Uninitialized(mixed_qkv.dtype, T * geo.key_dim());
  ActBuffer k = ActBuffer::Uninitialized(mixed_qkv.dtype, T * geo.key_dim());
  ActBuffer v = ActBuffer::Uninitialized(mixed_qkv.dtype, T * geo.value_dim());
  const LayerStateCache cache = Cache(layer.layer_id());
  RunShortConv(layer, mixed_qkv, {q.mut(), k.mut(), v.mut()}, PoolConvSeqs(cache));

  const auto N = static_cast<int64_t>(md_.recurrent_indices.size());
  CoreStep step = StepOver(layer, cache, o, q, k, v, gate_raw, beta_logits, T, N, md_.recurrent_indices.data(),
                           md_.has_initial_state.data(), md_.cu_q_lens.data());
  const int64_t rs = pools_.state_pool->spec().recurrent_size();
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
  ReportCore(layer, q, k, v, o);
}

void LinearRecurrentAttnBackend::ReportCore(const RadixLinearAttention& layer, const ActBuffer& q, const ActBuffer& k,
                                            const ActBuffer& v, MutBuf o) const {
  if (observer_ == nullptr) return;
  const int id = layer.layer_id();
  Report(id, LayerTensor::kQConv, q.view(), q.size());
  Report(id, LayerTensor::kKConv, k.view(), k.size());
  Report(id, LayerTensor::kVConv, v.view(), v.size());
  Report(id, LayerTensor::kCoreOutput, {o.data, o.dtype}, md_.num_tokens * layer.geometry().value_dim());
}

LayerStateCache LinearRecurrentAttnBackend::Cache(int layer_id) const {
  return pools_.state_pool->GetLayerCache(layer_id);
}

LinearRecurrentAttnBackend::ConvSeqs LinearRecurrentAttnBackend::PoolConvSeqs(const LayerStateCache& cache) const {
  return {.tails = MutBuf{cache.conv, cache.conv_dtype},
          .num_tails = cache.num_slots,
          .indices = md_.recurrent_indices.data(),
          .has_initial_state = md_.has_initial_state.data(),
          .cu = md_.cu_q_lens.data(),
          .N = static_cast<int64_t>(md_.recurrent_indices.size()),
          .T = md_.num_tokens};
}

void LinearRecurrentAttnBackend::RunShortConv(const RadixLinearAttention& layer, ConstBuf mixed_qkv,
                                              const ConvOutputs& out, const ConvSeqs& seqs) {
  const DeltaRuleGeometry& geo = layer.geometry();
  const int W = geo.W;
  const int64_t channels = geo.conv_channels();
  const MutBuf outs[3] = {out.q, out.k, out.v};
  const int64_t width[3] = {geo.key_dim(), geo.key_dim(), geo.value_dim()};
  // The groups' first channels: q|k|v, or Mamba2's x|B|C (v|k|q); the weights and the bias in channel order.
  const int64_t firsts[3] = {geo.q_channel(), geo.k_channel(), geo.v_channel()};
  for (int group = 0; group < 3; ++group) {
    const int64_t first = firsts[group];
    ShortConvArgs a;
    a.y = outs[group];
    a.x = Offset(mixed_qkv, first);
    a.x_row_stride = channels;
    a.weight = layer.conv_weight().data() + first * W;  // this group's [W, C_g]
    a.bias = layer.conv_bias().empty() ? nullptr : layer.conv_bias().data() + first;
    a.cu_seqlens = seqs.cu;
    a.N = seqs.N;
    a.T = seqs.T;
    a.C = width[group];
    a.W = W;
    a.tails = Offset(seqs.tails, first);
    a.tail_row_stride = channels;
    a.num_tails = seqs.num_tails;
    a.tail_indices = seqs.indices;
    a.has_initial_state = seqs.has_initial_state;
    short_conv_silu(a);
  }
}

void LinearRecurrentAttnBackend::SnapshotConvTails(const RadixLinearAttention& layer, ConstBuf mixed_qkv) {
  if (md_.snapshot_cu.empty()) return;
  const LayerStateCache cache = Cache(layer.layer_id());
  const int64_t tail_rows = layer.geometry().W - 1;
  const size_t row = static_cast<size_t>(layer.geometry().conv_channels()) * DTypeSize(cache.conv_dtype);
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

namespace {

// Bytes of one position in a verify area and where its parts start: the
// layer's mixed_qkv [C], gate_raw [gate_width] and beta_logits [HV] (the
// state spec's verify_row elements).
struct VerifyRow {
  size_t qkv, gate, beta, total;
  VerifyRow(const DeltaRuleGeometry& geo, DType dt)
      : qkv(static_cast<size_t>(geo.conv_channels()) * DTypeSize(dt)),
        gate(static_cast<size_t>(geo.gate_width()) * DTypeSize(dt)),
        beta(static_cast<size_t>(geo.HV) * DTypeSize(dt)),
        total(qkv + gate + beta) {}
};

// Position t of slot `slot`'s verify area.
uint8_t* VerifyPosition(const LayerStateCache& cache, const VerifyRow& row, int32_t slot, int64_t t) {
  return static_cast<uint8_t*>(cache.verify_inputs) + (static_cast<size_t>(slot * cache.verify_rows + t)) * row.total;
}

}  // namespace

void LinearRecurrentAttnBackend::ForwardVerify(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv,
                                               ConstBuf gate_raw, ConstBuf beta_logits) {
  const LayerStateCache cache = Cache(layer.layer_id());
  const int64_t T = md_.num_tokens;
  const auto N = static_cast<int64_t>(md_.recurrent_indices.size());
  const DeltaRuleGeometry& geo = layer.geometry();
  const int64_t rs = pools_.state_pool->spec().recurrent_size();
  const VerifyRow row(geo, cache.conv_dtype);
  const size_t tail_bytes = static_cast<size_t>(geo.W - 1) * row.qkv;
  // What the commit needs: each position's projections, in its slot's verify area.
  const auto* qkv_in = static_cast<const uint8_t*>(mixed_qkv.data);
  const auto* gate_in = static_cast<const uint8_t*>(gate_raw.data);
  const auto* beta_in = static_cast<const uint8_t*>(beta_logits.data);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t t = md_.cu_q_lens[n]; t < md_.cu_q_lens[n + 1]; ++t) {
      uint8_t* dst = VerifyPosition(cache, row, md_.recurrent_indices[n], t - md_.cu_q_lens[n]);
      std::memcpy(dst, qkv_in + t * row.qkv, row.qkv);
      std::memcpy(dst + row.qkv, gate_in + t * row.gate, row.gate);
      std::memcpy(dst + row.qkv + row.gate, beta_in + t * row.beta, row.beta);
    }
    if (md_.has_initial_state[n] == 0) {
      // A fresh request's committed state is zeros: its slot says so from here on.
      const int32_t slot = md_.recurrent_indices[n];
      std::fill_n(cache.recurrent + slot * rs, rs, 0.0F);
      std::memset(static_cast<uint8_t*>(cache.conv) + slot * tail_bytes, 0, tail_bytes);
    }
  }
  // The conv over a copy of the committed tails: the slots' tails stay as they are.
  ActBuffer tails = ActBuffer::Uninitialized(cache.conv_dtype, N * (geo.W - 1) * geo.conv_channels());
  std::vector<int32_t> tail_index(static_cast<size_t>(N));
  const std::vector<uint8_t> continues(static_cast<size_t>(N), 1);
  for (int64_t n = 0; n < N; ++n) {
    tail_index[n] = static_cast<int32_t>(n);
    std::memcpy(static_cast<uint8_t*>(tails.data()) + n * tail_bytes,
                static_cast<const uint8_t*>(cache.conv) + md_.recurrent_indices[n] * tail_bytes, tail_bytes);
  }
  ActBuffer q = ActBuffer::Uninitialized(mixed_qkv.dtype, T * geo.key_dim());
  ActBuffer k = ActBuffer::Uninitialized(mixed_qkv.dtype, T * geo.key_dim());
  ActBuffer v = ActBuffer::Uninitialized(mixed_qkv.dtype, T * geo.value_dim());
  RunShortConv(layer, mixed_qkv, {q.mut(), k.mut(), v.mut()},
               {.tails = tails.mut(),
                .num_tails = N,
                .indices = tail_index.data(),
                .has_initial_state = continues.data(),
                .cu = md_.cu_q_lens.data(),
                .N = N,
                .T = T});
  std::vector<float*> token_states;
  if (cache.verify_states != nullptr) {
    for (int64_t n = 0; n < N; ++n)
      token_states.push_back(cache.verify_states + md_.recurrent_indices[n] * cache.verify_rows * rs);
  }
  CoreStep step = StepOver(layer, cache, o, q, k, v, gate_raw, beta_logits, T, N, md_.recurrent_indices.data(),
                           continues.data(), md_.cu_q_lens.data());
  step.token_states = token_states.empty() ? nullptr : token_states.data();
  RunVerify(step);
  ReportCore(layer, q, k, v, o);
}

void LinearRecurrentAttnBackend::EndVerify() {
  if (md_.mode != ForwardMode::kTargetVerify) return;
  for (size_t n = 0; n < md_.recurrent_indices.size(); ++n) {
    pools_.state_pool->SetPendingVerify(md_.recurrent_indices[n], md_.cu_q_lens[n + 1] - md_.cu_q_lens[n]);
  }
}

void LinearRecurrentAttnBackend::InitCommit(const std::vector<int64_t>& req_ids, const std::vector<int64_t>& keep) {
  Check(keep.size() == req_ids.size(), "verify commit: req_ids and keep must have one entry per request");
  const RecurrentStatePool& pool = *pools_.state_pool;
  CommitMetadata c;
  c.cu.assign(1, 0);
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < req_ids.size(); ++i) {
    const int64_t req = req_ids[i];
    Check(seen.insert(req).second, "verify commit: request " + std::to_string(req) + " appears twice");
    Check(pools_.req_to_token_pool->Has(req), "verify commit: request " + std::to_string(req) + " holds no state slot");
    const int32_t slot = pools_.req_to_token_pool->SlotOf(req);
    const int64_t pending = pool.pending_verify(slot);
    Check(pending > 0, "verify commit: request " + std::to_string(req) + " has no verify step to commit");
    Check(keep[i] >= 0 && keep[i] <= pending, [&] {
      return "verify commit: request " + std::to_string(req) + " keeps " + std::to_string(keep[i]) +
             " positions of a verify step of " + std::to_string(pending) + " (expected 0.." + std::to_string(pending) +
             ")";
    });
    c.all_slots.push_back(slot);
    if (keep[i] == 0) continue;
    c.slots.push_back(slot);
    c.keep.push_back(keep[i]);
    c.cu.push_back(c.cu.back() + keep[i]);
  }
  commit_ = std::move(c);
}

void LinearRecurrentAttnBackend::CommitLayer(const RadixLinearAttention& layer) {
  const LayerStateCache cache = Cache(layer.layer_id());
  const auto N = static_cast<int64_t>(commit_.slots.size());
  if (N == 0) return;
  const int64_t T = commit_.cu.back();
  const DeltaRuleGeometry& geo = layer.geometry();
  const int64_t rs = pools_.state_pool->spec().recurrent_size();
  const DType dt = cache.conv_dtype;
  const VerifyRow row(geo, dt);
  // The kept positions' projections, packed.
  ActBuffer qkv_in = ActBuffer::Uninitialized(dt, T * geo.conv_channels());
  ActBuffer gate_in = ActBuffer::Uninitialized(dt, T * geo.gate_width());
  ActBuffer beta_in = ActBuffer::Uninitialized(dt, T * geo.HV);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t t = 0; t < commit_.keep[n]; ++t) {
      const uint8_t* src = VerifyPosition(cache, row, commit_.slots[n], t);
      const int64_t at = commit_.cu[n] + t;
      std::memcpy(static_cast<uint8_t*>(qkv_in.data()) + at * row.qkv, src, row.qkv);
      std::memcpy(static_cast<uint8_t*>(gate_in.data()) + at * row.gate, src + row.qkv, row.gate);
      std::memcpy(static_cast<uint8_t*>(beta_in.data()) + at * row.beta, src + row.qkv + row.gate, row.beta);
    }
  }
  // The conv moves the slots' tails past the kept positions (the verify step
  // zeroed a fresh request's tail, so every sequence continues its tail).
  const std::vector<uint8_t> continues(static_cast<size_t>(N), 1);
  ActBuffer q = ActBuffer::Uninitialized(dt, T * geo.key_dim());
  ActBuffer k = ActBuffer::Uninitialized(dt, T * geo.key_dim());
  ActBuffer v = ActBuffer::Uninitialized(dt, T * geo.value_dim());
  RunShortConv(layer, qkv_in.view(), {q.mut(), k.mut(), v.mut()},
               {.tails = MutBuf{cache.conv, dt},
                .num_tails = cache.num_slots,
                .indices = commit_.slots.data(),
                .has_initial_state = continues.data(),
                .cu = commit_.cu.data(),
                .N = N,
                .T = T});
  if (cache.verify_states != nullptr) {
    // The verify step kept the state after every position: the commit is a copy.
    for (int64_t n = 0; n < N; ++n) {
      const int32_t slot = commit_.slots[n];
      std::memcpy(cache.recurrent + slot * rs,
                  cache.verify_states + (slot * cache.verify_rows + commit_.keep[n] - 1) * rs,
                  static_cast<size_t>(rs) * sizeof(float));
    }
    return;
  }
  ActBuffer o = ActBuffer::Uninitialized(dt, T * geo.value_dim());
  const CoreStep step = StepOver(layer, cache, o.mut(), q, k, v, gate_in.view(), beta_in.view(), T, N,
                                 commit_.slots.data(), continues.data(), commit_.cu.data());
  RunCommit(step);
}

void LinearRecurrentAttnBackend::EndCommit() {
  for (int32_t slot : commit_.all_slots) pools_.state_pool->SetPendingVerify(slot, 0);
  commit_ = {};
}

}  // namespace kda
