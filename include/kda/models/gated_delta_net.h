// GatedDeltaNet: one Gated DeltaNet layer of Qwen3-Next (Qwen3NextGatedDeltaNet),
// Qwen3.5 (Qwen3_5GatedDeltaNet), Qwen4-Exp, Lara or OLMo hybrid, a
// DeltaRuleLayer whose projections are q|k|v (one GEMM, the conv's channels),
// z (the output gate, silu or sigmoid as the geometry says), b (beta)
// and a (the decay, one per value head), with the cast points of
// ../shared/tools/gdn_ref.py (those of the KDA design §2 carried over;
// models/qwen3_next/gated_delta_net.cc).
//
// Shapes: hidden model width; H key heads of K, HV = r*H value heads of V
// (value head h reads key head h / r); key_dim = H*K, value_dim = HV*V, conv
// channels C = 2*key_dim + value_dim (q|k|v, head-major), W conv width.
#pragma once

#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_layer.h"
#include "kda/models/layer_weights.h"

namespace kda {

class Communicator;

// The checkpoint layouts of `model.layers.{i}.linear_attn.*`:
// - kQwen3Next: in_proj_qkvz [H*(2K + 2rV), hidden], rows per key-head group
//   i: [q_i (K), k_i (K), v_i (rV), z_i (rV)]; in_proj_ba [2*HV, hidden], rows
//   per group [b_i (r), a_i (r)];
// - kQwen3_5 (also Qwen4-Exp): in_proj_qkv [C, hidden] (q|k|v), in_proj_z
//   [value_dim, hidden], in_proj_b and in_proj_a [HV, hidden];
// - kLaraMini: one in_proj [C + value_dim + 2*HV, hidden], rows q|k|v|z|b|a;
//   its norm is named out_norm;
// - kOlmoHybrid: q_proj, k_proj [key_dim, hidden], v_proj [value_dim, hidden],
//   a_proj, b_proj [HV, hidden], g_proj (the output gate, z) [value_dim,
//   hidden]; the convs apart, q_conv1d, k_conv1d [key_dim, 1, W] and v_conv1d
//   [value_dim, 1, W]; norm o_norm, output projection o_proj.
// All: conv1d [C, 1, W] (no bias; except kOlmoHybrid), A_log [HV], dt_bias
// [HV], norm [V] (a plain weight), out_proj [hidden, value_dim].
enum class GdnLayout : uint8_t { kQwen3Next, kQwen3_5, kLaraMini, kOlmoHybrid };

// The layout's tensor table (geometry: the full layer's). Key heads shard
// every projection's rows (a value head with its key head), the conv's
// channels, A_log, dt_bias and out_proj's input columns; norm is replicated.
TensorTable GatedDeltaNetTensors(GdnLayout layout, const DeltaRuleGeometry& g);

class GatedDeltaNet : public DeltaRuleLayer {
 public:
  // As KimiDeltaAttention's constructor; `geometry` a GDN one (per-value-head
  // decay).
  GatedDeltaNet(GdnLayout layout, int layer_id, const DeltaRuleGeometry& geometry, const LayerWeights& weights,
                DType act_dtype, Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);

 protected:
  void Project(ConstBuf x, int64_t T, Projected& out) const override;

 private:
  const Linear* z_proj_ = nullptr;
  const Linear* a_proj_ = nullptr;
};

}  // namespace kda
