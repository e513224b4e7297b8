#include "kda/models/kimi_delta_attention.h"

#include <cmath>
#include <memory>
#include <string>

#include "kda/base/error.h"
#include "models/projected.h"

namespace kda {
namespace {

const char* OutProjName(KdaLayout layout) { return layout == KdaLayout::kKimi ? "o_proj.weight" : "dense.weight"; }

}  // namespace

TensorTable KimiDeltaAttentionTensors(const DeltaRuleGeometry& g, KdaLayout layout) {
  const int64_t hid = g.hidden;
  const int64_t p = g.key_dim();
  const int64_t k = g.K;
  const int64_t h = g.H;
  const int64_t w = g.W;
  using I = TensorInit;
  using K = TensorInit::Kind;
  const ShardAxis none = ShardAxis::kNone;
  const ShardAxis rows = ShardAxis::kRows;
  TensorTable t = {
      {"q_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}},
      {"k_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}},
      {"v_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}},
      {"q_conv1d.weight", {{p, 1, w}, {p, w}}, w, rows, {k}, false, I{K::kNormal, 0.5F}},
      {"k_conv1d.weight", {{p, 1, w}, {p, w}}, w, rows, {k}, false, I{K::kNormal, 0.5F}},
      {"v_conv1d.weight", {{p, 1, w}, {p, w}}, w, rows, {k}, false, I{K::kNormal, 0.5F}},
  };
  // In the order a random model draws them.
  if (layout == KdaLayout::kKimi) {
    t.push_back({"f_a_proj.weight", {{k, hid}}, hid, none, {}, true, I{K::kNormal, 0.02F}});
    t.push_back({"f_b_proj.weight", {{p, k}}, k, rows, {k}, true, I{K::kNormal, 0.1F}});
    t.push_back({"b_proj.weight", {{h, hid}}, hid, rows, {1}, true, I{K::kNormal, 0.05F}});
    t.push_back({"g_a_proj.weight", {{k, hid}}, hid, none, {}, true, I{K::kNormal, 0.02F}});
    t.push_back({"g_b_proj.weight", {{p, k}}, k, rows, {k}, true, I{K::kNormal, 0.1F}});
  } else {
    t.push_back({"f_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}});
    t.push_back({"b_proj.weight", {{h, hid}}, hid, rows, {1}, true, I{K::kNormal, 0.05F}});
    t.push_back({"g_proj.weight", {{p, hid}}, hid, rows, {k}, true, I{K::kNormal, 0.02F}});
  }
  t.push_back({"o_norm.weight", {{k}}, 1, none, {}, false, I{K::kUniform, 0.5F, 1.5F}});
  t.push_back({OutProjName(layout), {{hid, p}}, p, ShardAxis::kCols, {k}, true, I{K::kNormal, 0.02F}});
  // A_log = log(U[1, 16]); dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1].
  t.push_back({"A_log", {{1, 1, h, 1}, {h}}, 1, rows, {1}, false, I{K::kUniform, 0.0F, std::log(16.0F)}});
  t.push_back({"dt_bias", {{p}}, 1, rows, {k}, false, I{K::kDtBias, std::log(1e-3F), std::log(1e-1F)}});
  return t;
}

KimiDeltaAttention::KimiDeltaAttention(int layer_id, const DeltaRuleGeometry& g, const LayerWeights& w, DType act_dtype,
                                       Communicator* tp, WeightFormat weights_format)
    : KimiDeltaAttention(KdaLayout::kKimi, layer_id, g, w, act_dtype, tp, weights_format) {}

KimiDeltaAttention::KimiDeltaAttention(KdaLayout layout, int layer_id, const DeltaRuleGeometry& g,
                                       const LayerWeights& w, DType act_dtype, Communicator* tp,
                                       WeightFormat weights_format)
    : DeltaRuleLayer(act_dtype, tp, weights_format) {
  g.Validate("KimiDeltaAttention");
  Check(g.decay == DecayWidth::kPerKeyDim,
        "KimiDeltaAttention: the geometry must be a KDA one (a decay per key dimension)");
  Check(g.K % 16 == 0 && g.K >= 16 && g.K <= 256,
        "KimiDeltaAttention: head dim must be a multiple of 16 in [16, 256], got " + std::to_string(g.K));
  CheckWeights(w, KimiDeltaAttentionTensors(g, layout), "KimiDeltaAttention");
  const int64_t hid = g.hidden;
  const int64_t p = g.key_dim();
  const int64_t k = g.K;
  // q|k|v share one GEMM: their outputs are the conv's channels in order.
  // (Q8 blocks lie within one output row, so quantizing the concatenation is
  // quantizing each.)
  qkv_proj_ = &AddProjection(w, {{"q_proj.weight", 0, p}, {"k_proj.weight", 0, p}, {"v_proj.weight", 0, p}}, hid,
                             "q_proj|k_proj|v_proj");
  if (layout == KdaLayout::kKimi) {
    f_proj_[0] = &AddProjection(w, {{"f_a_proj.weight", 0, k}}, hid, "f_a_proj");
    f_proj_[1] = &AddProjection(w, {{"f_b_proj.weight", 0, p}}, k, "f_b_proj");
    b_proj_ = &AddProjection(w, {{"b_proj.weight", 0, g.H}}, hid, "b_proj");
    g_proj_[0] = &AddProjection(w, {{"g_a_proj.weight", 0, k}}, hid, "g_a_proj");
    g_proj_[1] = &AddProjection(w, {{"g_b_proj.weight", 0, p}}, k, "g_b_proj");
  } else {
    f_proj_[0] = &AddProjection(w, {{"f_proj.weight", 0, p}}, hid, "f_proj");
    b_proj_ = &AddProjection(w, {{"b_proj.weight", 0, g.H}}, hid, "b_proj");
    g_proj_[0] = &AddProjection(w, {{"g_proj.weight", 0, p}}, hid, "g_proj");
  }
  std::vector<float> conv =
      ConvWeight({&w.Dense("q_conv1d.weight"), &w.Dense("k_conv1d.weight"), &w.Dense("v_conv1d.weight")}, g);
  // A_log and dt_bias stay fp32 parameters (design §1).
  auto attn = std::make_unique<RadixLinearAttention>(layer_id, g, std::move(conv), w.Dense("A_log"), w.Dense("dt_bias"),
                                                     1.0F / std::sqrt(static_cast<float>(k)));
  SetCore(w, OutProjName(layout), std::move(attn), w.Dense("o_norm.weight"));
}

void KimiDeltaAttention::Project(ConstBuf x, int64_t T, Projected& r) const {
  // fp32 accumulation, rounded once in the bf16 pipeline.
  const DeltaRuleGeometry& g = geometry();
  const int64_t p = g.key_dim();
  const DType dt = act_dtype();
  r.mixed_qkv = ActBuffer::Uninitialized(dt, T * 3 * p);
  r.gate_raw = ActBuffer::Uninitialized(dt, T * p);
  r.beta_logits = ActBuffer::Uninitialized(dt, T * g.H);
  r.output_gate = ActBuffer::Uninitialized(dt, T * p);
  qkv_proj_->Forward(r.mixed_qkv.mut(), x, T);
  // A gate projection: x -> [T, P] in one GEMM, or low-rank x -> [T, K] -> [T, P].
  const auto gate = [&](const Linear* const(&proj)[2], ActBuffer& scratch, ActBuffer& out) {
    if (proj[1] == nullptr) {
      proj[0]->Forward(out.mut(), x, T);
      return;
    }
    scratch = ActBuffer::Uninitialized(dt, T * g.K);
    proj[0]->Forward(scratch.mut(), x, T);
    proj[1]->Forward(out.mut(), scratch.view(), T);
  };
  gate(f_proj_, r.scratch[0], r.gate_raw);
  b_proj_->Forward(r.beta_logits.mut(), x, T);
  gate(g_proj_, r.scratch[1], r.output_gate);
}

}  // namespace kda
