#include "kda/models/gated_delta_net.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "models/projected.h"

namespace kda {

namespace {

// The names of the gated norm's weight and the output projection.
const char* NormName(GdnLayout layout) {
  switch (layout) {
    case GdnLayout::kOlmoHybrid:
      return "o_norm.weight";
    case GdnLayout::kLaraMini:
      return "out_norm.weight";
    default:
      return "norm.weight";
  }
}
const char* OutProjName(GdnLayout layout) {
  return layout == GdnLayout::kOlmoHybrid ? "o_proj.weight" : "out_proj.weight";
}

}  // namespace

TensorTable GatedDeltaNetTensors(GdnLayout layout, const DeltaRuleGeometry& g) {
  const int64_t hid = g.hidden;
  const int64_t kd = g.key_dim();
  const int64_t vd = g.value_dim();
  const int64_t k = g.K;
  const int64_t r = g.group();
  const int64_t rv = r * g.V;
  const int64_t c = g.conv_channels();
  const int64_t hv = g.HV;
  const int64_t w = g.W;
  using I = TensorInit;
  using K = TensorInit::Kind;
  const ShardAxis rows = ShardAxis::kRows;
  const I proj{K::kNormal, 0.02F};
  const I small{K::kNormal, 0.05F};
  const I conv{K::kNormal, 0.5F};
  TensorTable t;
  switch (layout) {
    case GdnLayout::kQwen3Next:
      t.push_back({"in_proj_qkvz.weight", {{c + vd, hid}}, hid, rows, {2 * k + 2 * rv}, true, proj});
      t.push_back({"in_proj_ba.weight", {{2 * hv, hid}}, hid, rows, {2 * r}, true, small});
      break;
    case GdnLayout::kQwen3_5:
      t.push_back({"in_proj_qkv.weight", {{c, hid}}, hid, rows, {k, k, rv}, true, proj});
      t.push_back({"in_proj_z.weight", {{vd, hid}}, hid, rows, {rv}, true, proj});
      t.push_back({"in_proj_b.weight", {{hv, hid}}, hid, rows, {r}, true, small});
      t.push_back({"in_proj_a.weight", {{hv, hid}}, hid, rows, {r}, true, small});
      break;
    case GdnLayout::kOlmoHybrid:
      t.push_back({"q_proj.weight", {{kd, hid}}, hid, rows, {k}, true, proj});
      t.push_back({"k_proj.weight", {{kd, hid}}, hid, rows, {k}, true, proj});
      t.push_back({"v_proj.weight", {{vd, hid}}, hid, rows, {rv}, true, proj});
      t.push_back({"a_proj.weight", {{hv, hid}}, hid, rows, {r}, true, small});
      t.push_back({"b_proj.weight", {{hv, hid}}, hid, rows, {r}, true, small});
      t.push_back({"g_proj.weight", {{vd, hid}}, hid, rows, {rv}, true, proj});
      t.push_back({"q_conv1d.weight", {{kd, 1, w}, {kd, w}}, w, rows, {k}, false, conv});
      t.push_back({"k_conv1d.weight", {{kd, 1, w}, {kd, w}}, w, rows, {k}, false, conv});
      t.push_back({"v_conv1d.weight", {{vd, 1, w}, {vd, w}}, w, rows, {rv}, false, conv});
      break;
    case GdnLayout::kLaraMini:
      t.push_back({"in_proj.weight", {{c + vd + 2 * hv, hid}}, hid, rows, {k, k, rv, rv, r, r}, true, proj});
      break;
  }
  if (layout != GdnLayout::kOlmoHybrid) {
    t.push_back({"conv1d.weight", {{c, 1, w}, {c, w}}, w, rows, {k, k, rv}, false, conv});
  }
  // A_log = log(U[1, 16]); dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1].
  t.push_back({"A_log", {{hv}}, 1, rows, {r}, false, I{K::kUniform, 0.0F, std::log(16.0F)}});
  t.push_back({"dt_bias", {{hv}}, 1, rows, {r}, false, I{K::kDtBias, std::log(1e-3F), std::log(1e-1F)}});
  t.push_back({NormName(layout), {{g.V}}, 1, ShardAxis::kNone, {}, false, I{K::kUniform, 0.5F, 1.5F}});
  t.push_back({OutProjName(layout), {{hid, vd}}, vd, ShardAxis::kCols, {rv}, true, proj});
  return t;
}

GatedDeltaNet::GatedDeltaNet(GdnLayout layout, int layer_id, const DeltaRuleGeometry& g, const LayerWeights& w,
                             DType act_dtype, Communicator* tp, WeightFormat weights_format)
    : DeltaRuleLayer(act_dtype, tp, weights_format) {
  g.Validate("GatedDeltaNet");
  Check(g.decay == DecayWidth::kPerValueHead,
        "GatedDeltaNet: the geometry must be a Gated DeltaNet one (one decay per value head)");
  CheckWeights(w, GatedDeltaNetTensors(layout, g), "GatedDeltaNet");
  const int64_t hid = g.hidden;
  const int64_t kd = g.key_dim();
  const int64_t vd = g.value_dim();
  const int64_t c = g.conv_channels();
  const int64_t K = g.K;
  const int64_t r = g.group();
  const int64_t rv = r * g.V;
  switch (layout) {
    case GdnLayout::kQwen3Next: {
      // De-interleaved once here: q, k, v and z of every key-head group in turn.
      const std::string qkvz = "in_proj_qkvz.weight";
      const std::string ba = "in_proj_ba.weight";
      const int64_t G = 2 * K + 2 * rv;
      std::vector<RowBlock> qkv_rows;
      std::vector<RowBlock> z_rows;
      std::vector<RowBlock> b_rows;
      std::vector<RowBlock> a_rows;
      const int64_t starts[3] = {0, K, 2 * K};
      const int64_t widths[3] = {K, K, rv};
      for (int part = 0; part < 3; ++part) {
        for (int64_t i = 0; i < g.H; ++i)
          qkv_rows.push_back({qkvz, i * G + starts[part], i * G + starts[part] + widths[part]});
      }
      for (int64_t i = 0; i < g.H; ++i) {
        z_rows.push_back({qkvz, i * G + 2 * K + rv, (i + 1) * G});
        b_rows.push_back({ba, i * 2 * r, i * 2 * r + r});
        a_rows.push_back({ba, i * 2 * r + r, (i + 1) * 2 * r});
      }
      qkv_proj_ = &AddProjection(w, qkv_rows, hid, "in_proj_qkvz (q|k|v rows)");
      z_proj_ = &AddProjection(w, z_rows, hid, "in_proj_qkvz (z rows)");
      b_proj_ = &AddProjection(w, b_rows, hid, "in_proj_ba (b rows)");
      a_proj_ = &AddProjection(w, a_rows, hid, "in_proj_ba (a rows)");
      break;
    }
    case GdnLayout::kQwen3_5:
      qkv_proj_ = &AddProjection(w, {{"in_proj_qkv.weight", 0, c}}, hid, "in_proj_qkv");
      z_proj_ = &AddProjection(w, {{"in_proj_z.weight", 0, vd}}, hid, "in_proj_z");
      b_proj_ = &AddProjection(w, {{"in_proj_b.weight", 0, g.HV}}, hid, "in_proj_b");
      a_proj_ = &AddProjection(w, {{"in_proj_a.weight", 0, g.HV}}, hid, "in_proj_a");
      break;
    case GdnLayout::kOlmoHybrid:
      qkv_proj_ = &AddProjection(w, {{"q_proj.weight", 0, kd}, {"k_proj.weight", 0, kd}, {"v_proj.weight", 0, vd}}, hid,
                                 "q_proj|k_proj|v_proj");
      z_proj_ = &AddProjection(w, {{"g_proj.weight", 0, vd}}, hid, "g_proj");
      b_proj_ = &AddProjection(w, {{"b_proj.weight", 0, g.HV}}, hid, "b_proj");
      a_proj_ = &AddProjection(w, {{"a_proj.weight", 0, g.HV}}, hid, "a_proj");
      break;
    case GdnLayout::kLaraMini: {
      // One fused in_proj, rows q|k|v|z|b|a.
      const std::string in = "in_proj.weight";
      qkv_proj_ = &AddProjection(w, {{in, 0, c}}, hid, "in_proj (q|k|v rows)");
      z_proj_ = &AddProjection(w, {{in, c, c + vd}}, hid, "in_proj (z rows)");
      b_proj_ = &AddProjection(w, {{in, c + vd, c + vd + g.HV}}, hid, "in_proj (b rows)");
      a_proj_ = &AddProjection(w, {{in, c + vd + g.HV, c + vd + 2 * g.HV}}, hid, "in_proj (a rows)");
      break;
    }
  }
  std::vector<float> conv;
  if (layout == GdnLayout::kOlmoHybrid) {
    conv = ConvWeight({&w.Dense("q_conv1d.weight"), &w.Dense("k_conv1d.weight"), &w.Dense("v_conv1d.weight")}, g);
  } else {
    const std::vector<float>& all = w.Dense("conv1d.weight");
    const auto at = [&](int64_t row) { return all.begin() + row * g.W; };
    const std::vector<float> q(at(0), at(kd));
    const std::vector<float> k(at(kd), at(2 * kd));
    const std::vector<float> v(at(2 * kd), all.end());
    conv = ConvWeight({&q, &k, &v}, g);
  }
  // A_log and dt_bias stay fp32 parameters.
  auto attn = std::make_unique<RadixLinearAttention>(layer_id, g, std::move(conv), w.Dense("A_log"), w.Dense("dt_bias"),
                                                     1.0F / std::sqrt(static_cast<float>(K)));
  SetCore(w, OutProjName(layout), std::move(attn), w.Dense(NormName(layout)));
}

void GatedDeltaNet::Project(ConstBuf x, int64_t T, Projected& r) const {
  // fp32 accumulation, rounded once in the bf16 pipeline.
  const DeltaRuleGeometry& g = geometry();
  const DType dt = act_dtype();
  r.mixed_qkv = ActBuffer::Uninitialized(dt, T * g.conv_channels());
  r.output_gate = ActBuffer::Uninitialized(dt, T * g.value_dim());
  r.beta_logits = ActBuffer::Uninitialized(dt, T * g.HV);
  r.gate_raw = ActBuffer::Uninitialized(dt, T * g.HV);
  qkv_proj_->Forward(r.mixed_qkv.mut(), x, T);
  z_proj_->Forward(r.output_gate.mut(), x, T);
  b_proj_->Forward(r.beta_logits.mut(), x, T);
  a_proj_->Forward(r.gate_raw.mut(), x, T);
}

}  // namespace kda
