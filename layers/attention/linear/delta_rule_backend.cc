#include "kda/layers/attention/linear/delta_rule_backend.h"

#include <cstdint>

#include "base/scratch.h"
#include "kda/base/bf16.h"
#include "kda/kernels/elementwise.h"
#include "kda/layers/radix_linear_attention.h"

namespace kda {

DeltaRuleAttnBackend::DeltaRuleAttnBackend(MemoryPools pools, KernelImpl kernel)
    : LinearRecurrentAttnBackend(pools), kernel_(ResolveKernelImpl(kernel)) {}

namespace {

// The forget gate g [T, HV, K] (KDA) or [T, HV] (GDN) (fp32 log space,
// unbounded below) and beta [T, HV] of a step. One gate kernel for both
// widths: a GDN gate is the KDA gate with one dimension per value head.
struct GateBeta {
  ScratchArray<float> g, beta;
};

GateBeta ComputeGateBeta(const RadixLinearAttention& layer, ConstBuf gate_raw, ConstBuf beta_logits, int64_t T) {
  const DeltaRuleGeometry& geo = layer.geometry();
  GateBeta gb{ScratchArray<float>(static_cast<size_t>(T * geo.gate_width())),
              ScratchArray<float>(static_cast<size_t>(T * geo.HV))};
  KdaGateBeta(gb.g.data(), gb.beta.data(), gate_raw, beta_logits, layer.A_log().data(), layer.dt_bias().data(), T,
              geo.HV, geo.decay_per_head(), {.lower_bound = geo.gate_lower_bound, .beta_scale = geo.beta_scale});
  if (geo.gate_in_act_dtype && gate_raw.dtype == DType::kBF16) {
    for (size_t i = 0; i < gb.g.size(); ++i) gb.g.data()[i] = RoundBF16(gb.g.data()[i]);
  }
  return gb;
}

// g's view of `rows` batch rows of `t` tokens: [rows, t, HV, K] or [rows, t, HV].
TensorView GateView(const DeltaRuleGeometry& geo, const float* g, int64_t rows, int64_t t) {
  if (geo.decay == DecayWidth::kPerValueHead) return ContiguousView<const void*>(g, DType::kF32, {rows, t, geo.HV});
  return ContiguousView<const void*>(g, DType::kF32, {rows, t, geo.HV, geo.K});
}

// The step's tokens and options as a core call: `rows` batch rows of `t`
// tokens ([1, T, ...] for prefill, [N, 1, ...] for decode).
template <class Call>
Call CoreCall(const LinearRecurrentAttnBackend::CoreStep& s, const GateBeta& gb, int64_t rows, int64_t t) {
  const DeltaRuleGeometry& geo = s.layer.geometry();
  Call c;
  c.o = ContiguousView<void*>(s.o.data, s.o.dtype, {rows, t, geo.HV, geo.V});
  c.q = ContiguousView<const void*>(s.q.data, s.q.dtype, {rows, t, geo.H, geo.K});
  c.k = ContiguousView<const void*>(s.k.data, s.k.dtype, {rows, t, geo.H, geo.K});
  c.v = ContiguousView<const void*>(s.v.data, s.v.dtype, {rows, t, geo.HV, geo.V});
  c.g = GateView(geo, gb.g.data(), rows, t);
  c.beta = ContiguousView<const void*>(gb.beta.data(), DType::kF32, {rows, t, geo.HV});
  c.scale = s.layer.scale();
  c.use_qk_l2norm_in_kernel = true;
  return c;
}

// The recurrent kernel over the step's sequences, each starting from its
// slot: packed ([1, T, ...] with cu_seqlens), or one token each ([N, 1, ...]).
RecurrentKdaCall SlotsCall(const LinearRecurrentAttnBackend::CoreStep& s, const GateBeta& gb, bool packed) {
  RecurrentKdaCall c = CoreCall<RecurrentKdaCall>(s, gb, packed ? 1 : s.num_seqs, packed ? s.num_tokens : 1);
  if (packed) c.cu_seqlens = s.cu_seqlens;
  c.initial_state = s.state;
  c.ssm_state_indices = s.state_indices;
  return c;
}

}  // namespace

template <class Run>
void DeltaRuleAttnBackend::WithGate(const CoreStep& s, Run run) const {
  const GateBeta gb = ComputeGateBeta(s.layer, s.gate_raw, s.beta_logits, s.num_tokens);
  run(gb);
  const int id = s.layer.layer_id();
  const int64_t gates = s.num_tokens * s.layer.geometry().gate_width();
  Report(id, LayerTensor::kGateRaw, s.gate_raw, gates);
  Report(id, LayerTensor::kGate, {gb.g.data(), DType::kF32}, gates);
  Report(id, LayerTensor::kBeta, {gb.beta.data(), DType::kF32}, s.num_tokens * s.layer.geometry().HV);
}

void DeltaRuleAttnBackend::RunExtend(const CoreStep& s) {
  WithGate(s, [&](const GateBeta& gb) {
    ChunkKdaCall c = CoreCall<ChunkKdaCall>(s, gb, 1, s.num_tokens);
    c.cu_seqlens = s.cu_seqlens;
    c.state = s.state;  // fresh requests start from zeros (has_initial_state)
    c.state_indices = s.state_indices;
    c.has_initial_state = s.has_initial_state;
    c.snapshot_cu = s.snapshot_cu;
    c.snapshot_offsets = s.snapshot_offsets;
    c.snapshot_states = s.snapshot_states;
    chunk_kda(c, kernel_);
  });
}

void DeltaRuleAttnBackend::RunDecode(const CoreStep& s) {
  WithGate(s, [&](const GateBeta& gb) { fused_recurrent_kda(SlotsCall(s, gb, false), kernel_); });
}

void DeltaRuleAttnBackend::RunVerify(const CoreStep& s) {
  WithGate(s, [&](const GateBeta& gb) {
    if (s.token_states == nullptr) {
      RecurrentKdaCall c = SlotsCall(s, gb, true);
      c.inplace_final_state = false;  // the slots are only read
      fused_recurrent_kda(c, kernel_);
    } else {
      // The state after every token of sequence n goes to its own area: one call per sequence.
      const DeltaRuleGeometry& geo = s.layer.geometry();
      const int64_t H = geo.H;
      const int64_t HV = geo.HV;
      const int64_t K = geo.K;
      const int64_t V = geo.V;
      const int64_t G = geo.gate_width();
      const auto* cu = static_cast<const int64_t*>(s.cu_seqlens.data);
      const auto* slots = static_cast<const int32_t*>(s.state_indices.data);
      const size_t esize = DTypeSize(s.q.dtype);
      for (int64_t n = 0; n < s.num_seqs; ++n) {
        const int64_t b = cu[n];
        const int64_t len = cu[n + 1] - b;
        if (len == 0) continue;
        const auto at = [&](const void* base, size_t elem, int64_t per_token) {
          return static_cast<const uint8_t*>(base) + static_cast<size_t>(b * per_token) * elem;
        };
        RecurrentKdaCall c;
        c.o = ContiguousView<void*>(static_cast<uint8_t*>(s.o.data) + static_cast<size_t>(b * HV * V) * esize,
                                    s.o.dtype, {1, len, HV, V});
        c.q = ContiguousView<const void*>(at(s.q.data, esize, H * K), s.q.dtype, {1, len, H, K});
        c.k = ContiguousView<const void*>(at(s.k.data, esize, H * K), s.k.dtype, {1, len, H, K});
        c.v = ContiguousView<const void*>(at(s.v.data, esize, HV * V), s.v.dtype, {1, len, HV, V});
        c.g = GateView(geo, reinterpret_cast<const float*>(at(gb.g.data(), sizeof(float), G)), 1, len);
        c.beta = ContiguousView<const void*>(at(gb.beta.data(), sizeof(float), HV), DType::kF32, {1, len, HV});
        c.scale = s.layer.scale();
        c.use_qk_l2norm_in_kernel = true;
        c.initial_state = s.state;
        c.ssm_state_indices = ContiguousView<const void*>(slots + n, DType::kI32, {1});
        c.inplace_final_state = false;
        c.output_final_state = true;
        c.final_state = ContiguousView<void*>(s.token_states[n], DType::kF32, {len, HV, K, V});
        fused_recurrent_kda(c, kernel_);
      }
    }
  });
}

void DeltaRuleAttnBackend::RunCommit(const CoreStep& s) {
  const GateBeta gb = ComputeGateBeta(s.layer, s.gate_raw, s.beta_logits, s.num_tokens);
  fused_recurrent_kda(SlotsCall(s, gb, true), kernel_);
}

}  // namespace kda
