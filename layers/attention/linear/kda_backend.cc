#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_set>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/short_conv.h"
#include "kda/layers/radix_linear_attention.h"

namespace kda {

KDAAttnBackend::KDAAttnBackend(MemoryPools pools, KernelImpl kernel)
    : LinearRecurrentAttnBackend(pools), kernel_(ResolveKernelImpl(kernel)) {}

struct KDAAttnBackend::Inputs {
  ActBuffer q, k, v;         // [T, P]
  ScratchArray<float> g;     // [T, H, K] fp32 log decay
  ScratchArray<float> beta;  // [T, H] fp32
};

void KDAAttnBackend::Prepare(const RadixLinearAttention& layer, ConstBuf mixed_qkv, ConstBuf gate_raw,
                             ConstBuf beta_logits, Inputs& in) {
  const int64_t T = md_.num_tokens;
  const int64_t p = layer.projection_size();
  const int H = layer.num_heads();
  const int K = layer.head_k_dim();
  in.q = ActBuffer::Uninitialized(mixed_qkv.dtype, T * p);
  in.k = ActBuffer::Uninitialized(mixed_qkv.dtype, T * p);
  in.v = ActBuffer::Uninitialized(mixed_qkv.dtype, T * p);
  RunShortConv(layer, mixed_qkv, {in.q.mut(), in.k.mut(), in.v.mut()});
  // Forget gate (fp32 log space, unbounded below) and beta.
  in.g = ScratchArray<float>(static_cast<size_t>(T * p));
  in.beta = ScratchArray<float>(static_cast<size_t>(T * H));
  KdaGateBeta(in.g.data(), in.beta.data(), gate_raw, beta_logits, layer.A_log().data(), layer.dt_bias().data(), T, H,
              K);
}

namespace {

// The core's tensors of one layer (tp = T * H * K values of gate_raw and o).
void ReportTensors(LayerObserver& obs, int layer_id, const ActBuffer& q, const ActBuffer& k, const ActBuffer& v,
                   ConstBuf gate_raw, const ScratchArray<float>& g, const ScratchArray<float>& beta, MutBuf o,
                   int64_t tp) {
  obs.OnTensor(layer_id, LayerTensor::kQConv, q.view(), q.size());
  obs.OnTensor(layer_id, LayerTensor::kKConv, k.view(), k.size());
  obs.OnTensor(layer_id, LayerTensor::kVConv, v.view(), v.size());
  obs.OnTensor(layer_id, LayerTensor::kGateRaw, gate_raw, tp);
  obs.OnTensor(layer_id, LayerTensor::kGate, {g.data(), DType::kF32}, static_cast<int64_t>(g.size()));
  obs.OnTensor(layer_id, LayerTensor::kBeta, {beta.data(), DType::kF32}, static_cast<int64_t>(beta.size()));
  obs.OnTensor(layer_id, LayerTensor::kCoreOutput, {o.data, o.dtype}, tp);
}

KdaOptions CoreOptions(const RadixLinearAttention& layer) {
  KdaOptions opt;
  opt.scale = layer.scale();
  opt.use_qk_l2norm_in_kernel = true;
  return opt;
}

}  // namespace

void KDAAttnBackend::ForwardExtend(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                                   ConstBuf beta_logits) {
  SnapshotConvTails(layer, mixed_qkv);  // before the conv moves the slots' tails
  Inputs in;
  Prepare(layer, mixed_qkv, gate_raw, beta_logits, in);
  const LayerStateCache cache = Cache(layer.layer_id());
  ChunkKdaArgs a;
  std::vector<float*> snapshots;  // this layer's part of each snapshot
  if (!md_.snapshot_cu.empty()) {
    const int64_t rs = pools_.state_pool->shape().RecurrentStateSize();
    for (float* s : md_.snapshot_recurrent) snapshots.push_back(s + layer.layer_id() * rs);
    a.snapshot_cu = md_.snapshot_cu.data();
    a.snapshot_offsets = md_.snapshot_offsets.data();
    a.snapshot_states = snapshots.data();
  }
  a.o = o;
  a.q = in.q.view();
  a.k = in.k.view();
  a.v = in.v.view();
  a.g = {in.g.data(), DType::kF32};
  a.beta = {in.beta.data(), DType::kF32};
  a.cu_seqlens = md_.cu_q_lens.data();
  // States read and written in place in the pool's slots; fresh requests start from zeros.
  a.state = cache.recurrent;
  a.state_indices = md_.recurrent_indices.data();
  a.num_states = cache.num_slots;
  a.has_initial_state = md_.has_initial_state.data();
  a.output_final_state = true;
  a.T = md_.num_tokens;
  a.N = static_cast<int64_t>(md_.recurrent_indices.size());
  a.H = layer.num_heads();
  a.K = layer.head_k_dim();
  a.V = layer.head_v_dim();
  a.options = CoreOptions(layer);
  chunk_kda(a, kernel_);
  if (observer_ != nullptr) {
    ReportTensors(*observer_, layer.layer_id(), in.q, in.k, in.v, gate_raw, in.g, in.beta, o,
                  md_.num_tokens * a.H * a.K);
  }
}

void KDAAttnBackend::ForwardDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                                   ConstBuf beta_logits) {
  Inputs in;
  Prepare(layer, mixed_qkv, gate_raw, beta_logits, in);
  const LayerStateCache cache = Cache(layer.layer_id());
  const int64_t rs = pools_.state_pool->shape().RecurrentStateSize();
  const auto N = static_cast<int64_t>(md_.recurrent_indices.size());
  for (int64_t n = 0; n < N; ++n) {
    if (md_.has_initial_state[n] == 0) std::fill_n(cache.recurrent + md_.recurrent_indices[n] * rs, rs, 0.0F);
  }
  RecurrentKdaArgs a;
  a.o = o;
  a.state = cache.recurrent;
  a.state_indices = md_.recurrent_indices.data();
  a.num_states = cache.num_slots;
  a.q = in.q.view();
  a.k = in.k.view();
  a.v = in.v.view();
  a.g = {in.g.data(), DType::kF32};
  a.beta = {in.beta.data(), DType::kF32};
  a.N = N;
  a.H = layer.num_heads();
  a.K = layer.head_k_dim();
  a.V = layer.head_v_dim();
  a.options = CoreOptions(layer);
  fused_recurrent_kda(a, kernel_);
  if (observer_ != nullptr) {
    ReportTensors(*observer_, layer.layer_id(), in.q, in.k, in.v, gate_raw, in.g, in.beta, o, N * a.H * a.K);
  }
}

}  // namespace kda
