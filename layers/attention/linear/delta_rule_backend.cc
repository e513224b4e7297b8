#include "kda/layers/attention/linear/delta_rule_backend.h"

#include <cstdint>
#include <vector>

#include "base/scratch.h"
#include "kda/base/bf16.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
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
  if (geo.ssd) {  // Mamba2: beta is the step size dt, g = dt A; no beta logits
    SsdGateDt(gb.g.data(), gb.beta.data(), gate_raw, layer.A_log().data(), layer.dt_bias().data(), T, geo.HV,
              geo.dt_min, geo.dt_max);
    return gb;
  }
  KdaGateBeta(gb.g.data(), gb.beta.data(), gate_raw, beta_logits, layer.A_log().data(), layer.dt_bias().data(), T,
              geo.HV, geo.decay_per_head(), {.lower_bound = geo.gate_lower_bound, .beta_scale = geo.beta_scale});
  if (geo.gate_in_act_dtype && gate_raw.dtype == DType::kBF16) {
    for (size_t i = 0; i < gb.g.size(); ++i) gb.g.data()[i] = RoundBF16(gb.g.data()[i]);
  }
  return gb;
}

// The step's tokens and options as kernel arguments, trusted (RunTrusted): their shapes are the layer's
// geometry, checked when the layer and the pool were built, and the step's sequences and slots were checked
// by InitForwardMetadata.
template <class Args>
Args CoreArgs(const LinearRecurrentAttnBackend::CoreStep& s, const GateBeta& gb) {
  const DeltaRuleGeometry& geo = s.layer.geometry();
  Args a;
  SetTokensAndHeads(a, s.o, s.q, s.k, s.v, {gb.g.data(), DType::kF32}, {gb.beta.data(), DType::kF32}, geo.H, geo.HV,
                    geo.K, geo.V);
  a.scalar_gate = geo.decay == DecayWidth::kPerValueHead;
  a.T = s.num_tokens;
  a.N = s.num_seqs;
  a.options.scale = s.layer.scale();
  // Mamba2's SSD: no L2 norm of B and C, no delta correction, states [HV, V, K] (transformers' [H, P, N]).
  a.options.use_qk_l2norm_in_kernel = !geo.ssd;
  a.options.delta_correction = !geo.ssd;
  // Mamba2's skip y = o + D x in the kernel, before o's one rounding to the activation dtype.
  if (geo.ssd) a.options.D = s.layer.D().data();
  a.state_v_first = geo.ssd;
  return a;
}

// The recurrent kernel over the step's sequences, each from its pool slot (written back with `write`):
// packed ([T] tokens in cu_seqlens' sequences), or one token each (decode: the boundaries 0, 1, .., N in
// `decode_cu`, a buffer the arguments point to).
RecurrentKdaArgs SlotsArgs(const LinearRecurrentAttnBackend::CoreStep& s, const GateBeta& gb, bool packed, bool write,
                           std::vector<int64_t>& decode_cu) {
  RecurrentKdaArgs a = CoreArgs<RecurrentKdaArgs>(s, gb);
  if (packed) {
    a.cu_seqlens = static_cast<const int64_t*>(s.cu_seqlens.data);
  } else {
    decode_cu.resize(static_cast<size_t>(s.num_seqs) + 1);
    for (int64_t n = 0; n <= s.num_seqs; ++n) decode_cu[n] = n;
    a.cu_seqlens = decode_cu.data();
  }
  a.state = DataOrEmpty<float>(s.state);
  a.state_indices = DataOrEmpty<const int32_t>(s.state_indices);
  a.num_states = s.state.shape[0];
  a.write_slots = write;
  return a;
}

}  // namespace

template <class Run>
void DeltaRuleAttnBackend::WithGate(const CoreStep& s, Run run) const {
  const GateBeta gb = ComputeGateBeta(s.layer, s.gate_raw, s.beta_logits, s.num_tokens);
  run(s, gb);
  const int id = s.layer.layer_id();
  const int64_t gates = s.num_tokens * s.layer.geometry().gate_width();
  Report(id, LayerTensor::kGateRaw, s.gate_raw, gates);
  Report(id, LayerTensor::kGate, {gb.g.data(), DType::kF32}, gates);
  Report(id, LayerTensor::kBeta, {gb.beta.data(), DType::kF32}, s.num_tokens * s.layer.geometry().HV);
}

void DeltaRuleAttnBackend::RunExtend(const CoreStep& step) {
  WithGate(step, [&](const CoreStep& s, const GateBeta& gb) {
    ChunkKdaArgs a = CoreArgs<ChunkKdaArgs>(s, gb);
    a.cu_seqlens = static_cast<const int64_t*>(s.cu_seqlens.data);
    a.state = DataOrEmpty<float>(s.state);  // fresh requests start from zeros (has_initial_state)
    a.state_indices = DataOrEmpty<const int32_t>(s.state_indices);
    a.num_states = s.state.shape[0];
    a.has_initial_state = static_cast<const uint8_t*>(s.has_initial_state.data);
    a.snapshot_cu = s.snapshot_cu;
    a.snapshot_offsets = s.snapshot_offsets;
    a.snapshot_states = s.snapshot_states;
    RunTrusted(a, kernel_);
  });
}

void DeltaRuleAttnBackend::RunDecode(const CoreStep& step) {
  WithGate(step, [&](const CoreStep& s, const GateBeta& gb) {
    RunTrusted(SlotsArgs(s, gb, false, true, decode_cu_), kernel_);
  });
}

void DeltaRuleAttnBackend::RunVerify(const CoreStep& step) {
  WithGate(step, [&](const CoreStep& s, const GateBeta& gb) {
    if (s.token_states == nullptr) {
      RunTrusted(SlotsArgs(s, gb, true, /*write=*/false, decode_cu_), kernel_);  // the slots are only read
      return;
    }
    // The state after every token of sequence n goes to its own area: one call per sequence.
    const DeltaRuleGeometry& geo = s.layer.geometry();
    const auto* cu = static_cast<const int64_t*>(s.cu_seqlens.data);
    const auto* slots = static_cast<const int32_t*>(s.state_indices.data);
    const size_t esize = DTypeSize(s.q.dtype);
    const size_t osize = DTypeSize(s.o.dtype);
    for (int64_t n = 0; n < s.num_seqs; ++n) {
      const int64_t b = cu[n];
      const int64_t len = cu[n + 1] - b;
      if (len == 0) continue;
      // Token b on of a per-token buffer of `per_token` elements of `elem` bytes.
      const auto at = [&](const void* base, size_t elem, int64_t per_token) {
        return static_cast<const uint8_t*>(base) + static_cast<size_t>(b * per_token) * elem;
      };
      const int64_t bounds[2] = {0, len};
      RecurrentKdaArgs a = SlotsArgs(s, gb, true, /*write=*/false, decode_cu_);
      a.o.data = static_cast<uint8_t*>(s.o.data) + static_cast<size_t>(b * geo.value_dim()) * osize;
      a.q.data = at(s.q.data, esize, geo.key_dim());
      a.k.data = at(s.k.data, esize, geo.key_dim());
      a.v.data = at(s.v.data, esize, geo.value_dim());
      a.g.data = at(gb.g.data(), sizeof(float), geo.gate_width());
      a.beta.data = at(gb.beta.data(), sizeof(float), geo.HV);
      a.T = len;
      a.N = 1;
      a.cu_seqlens = bounds;
      a.state_indices = slots + n;
      a.token_states = s.token_states[n];
      RunTrusted(a, kernel_);
    }
  });
}

void DeltaRuleAttnBackend::RunCommit(const CoreStep& s) {
  const GateBeta gb = ComputeGateBeta(s.layer, s.gate_raw, s.beta_logits, s.num_tokens);
  RunTrusted(SlotsArgs(s, gb, true, /*write=*/true, decode_cu_), kernel_);
}

}  // namespace kda
