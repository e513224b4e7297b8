#include "kda/models/kimi_delta_attention.h"

#include <cmath>
#include <memory>
#include <string>

#include "kda/base/error.h"
#include "models/projected.h"

namespace kda {

TensorTable KimiDeltaAttentionTensors(const DeltaRuleGeometry& g) {
  const int64_t hid = g.hidden;
  const int64_t p = g.key_dim();
  const int64_t k = g.K;
  const int64_t h = g.H;
  const int64_t w = g.W;
  using I = TensorInit;
  using K = TensorInit::Kind;
  const ShardAxis none = ShardAxis::kNone;
  const ShardAxis rows = ShardAxis::kRows;
  // In the order a random model draws them.
  return {
      {"q_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}},
      {"k_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}},
      {"v_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}},
      {"q_conv1d.weight", {{p, 1, w}, {p, w}}, w, rows, {k}, false, I{K::kNormal, 0.5F}},
      {"k_conv1d.weight", {{p, 1, w}, {p, w}}, w, rows, {k}, false, I{K::kNormal, 0.5F}},
      {"v_conv1d.weight", {{p, 1, w}, {p, w}}, w, rows, {k}, false, I{K::kNormal, 0.5F}},
      {"f_a_proj.weight", {{k, hid}}, hid, none, {}, true, I{K::kNormal, 0.02F}},
      {"f_b_proj.weight", {{p, k}}, k, rows, {k}, true, I{K::kNormal, 0.1F}},
      {"b_proj.weight", {{h, hid}}, hid, rows, {1}, true, I{K::kNormal, 0.05F}},
      {"g_a_proj.weight", {{k, hid}}, hid, none, {}, true, I{K::kNormal, 0.02F}},
      {"g_b_proj.weight", {{p, k}}, k, rows, {k}, true, I{K::kNormal, 0.1F}},
      {"o_norm.weight", {{k}}, 1, none, {}, false, I{K::kUniform, 0.5F, 1.5F}},
      {"o_proj.weight", {{hid, p}}, p, ShardAxis::kCols, {k}, true, I{K::kNormal, 0.02F}},
      // A_log = log(U[1, 16]); dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1].
      {"A_log", {{1, 1, h, 1}, {h}}, 1, rows, {1}, false, I{K::kUniform, 0.0F, std::log(16.0F)}},
      {"dt_bias", {{p}}, 1, rows, {k}, false, I{K::kDtBias, std::log(1e-3F), std::log(1e-1F)}},
  };
}

KimiDeltaAttention::KimiDeltaAttention(int layer_id, const DeltaRuleGeometry& g, const LayerWeights& w, DType act_dtype,
                                       Communicator* tp, WeightFormat weights_format)
    : DeltaRuleLayer(act_dtype, tp, weights_format) {
  g.Validate("KimiDeltaAttention");
  Check(g.decay == DecayWidth::kPerKeyDim && g.output_gate == GateActivation::kSigmoid,
        "KimiDeltaAttention: the geometry must be a KDA one (per-key-dim decay, sigmoid output gate)");
  Check(g.K % 16 == 0 && g.K >= 16 && g.K <= 256,
        "KimiDeltaAttention: head dim must be a multiple of 16 in [16, 256], got " + std::to_string(g.K));
  CheckWeights(w, KimiDeltaAttentionTensors(g), "KimiDeltaAttention");
  const int64_t hid = g.hidden;
  const int64_t p = g.key_dim();
  const int64_t k = g.K;
  // q|k|v share one GEMM: their outputs are the conv's channels in order.
  // (Q8 blocks lie within one output row, so quantizing the concatenation is
  // quantizing each.)
  qkv_proj_ = &AddProjection(w, {{"q_proj.weight", 0, p}, {"k_proj.weight", 0, p}, {"v_proj.weight", 0, p}}, hid,
                             "q_proj|k_proj|v_proj");
  f_a_proj_ = &AddProjection(w, {{"f_a_proj.weight", 0, k}}, hid, "f_a_proj");
  f_b_proj_ = &AddProjection(w, {{"f_b_proj.weight", 0, p}}, k, "f_b_proj");
  b_proj_ = &AddProjection(w, {{"b_proj.weight", 0, g.H}}, hid, "b_proj");
  g_a_proj_ = &AddProjection(w, {{"g_a_proj.weight", 0, k}}, hid, "g_a_proj");
  g_b_proj_ = &AddProjection(w, {{"g_b_proj.weight", 0, p}}, k, "g_b_proj");
  std::vector<float> conv =
      ConvWeight({&w.Dense("q_conv1d.weight"), &w.Dense("k_conv1d.weight"), &w.Dense("v_conv1d.weight")}, g);
  // A_log and dt_bias stay fp32 parameters (design §1).
  auto attn = std::make_unique<RadixLinearAttention>(layer_id, g, std::move(conv), w.Dense("A_log"), w.Dense("dt_bias"),
                                                     1.0F / std::sqrt(static_cast<float>(k)));
  SetCore(w, "o_proj.weight", std::move(attn), w.Dense("o_norm.weight"));
}

void KimiDeltaAttention::Project(ConstBuf x, int64_t T, Projected& r) const {
  // fp32 accumulation, rounded once in the bf16 pipeline.
  const DeltaRuleGeometry& g = geometry();
  const int64_t p = g.key_dim();
  const DType dt = act_dtype();
  r.mixed_qkv = ActBuffer::Uninitialized(dt, T * 3 * p);
  r.scratch[0] = ActBuffer::Uninitialized(dt, T * g.K);
  r.gate_raw = ActBuffer::Uninitialized(dt, T * p);
  r.beta_logits = ActBuffer::Uninitialized(dt, T * g.H);
  r.scratch[1] = ActBuffer::Uninitialized(dt, T * g.K);
  r.output_gate = ActBuffer::Uninitialized(dt, T * p);
  qkv_proj_->Forward(r.mixed_qkv.mut(), x, T);
  f_a_proj_->Forward(r.scratch[0].mut(), x, T);
  f_b_proj_->Forward(r.gate_raw.mut(), r.scratch[0].view(), T);
  b_proj_->Forward(r.beta_logits.mut(), x, T);
  g_a_proj_->Forward(r.scratch[1].mut(), x, T);
  g_b_proj_->Forward(r.output_gate.mut(), r.scratch[1].view(), T);
}

}  // namespace kda
