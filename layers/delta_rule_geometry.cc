#include "kda/layers/delta_rule_geometry.h"

#include <cmath>
#include <string>

#include "kda/base/error.h"

namespace kda {

DeltaRuleGeometry DeltaRuleGeometry::Kda(int64_t hidden, int heads, int head_dim, int conv_width, double eps) {
  DeltaRuleGeometry g = Gdn(hidden, heads, heads, head_dim, head_dim, conv_width, eps);
  g.decay = DecayWidth::kPerKeyDim;
  g.output_gate = GateActivation::kSigmoid;
  return g;
}

DeltaRuleGeometry DeltaRuleGeometry::Gdn(int64_t hidden, int key_heads, int value_heads, int head_k_dim, int head_v_dim,
                                         int conv_width, double eps) {
  return {.hidden = hidden,
          .H = key_heads,
          .HV = value_heads,
          .K = head_k_dim,
          .V = head_v_dim,
          .W = conv_width,
          .rms_norm_eps = eps,
          .decay = DecayWidth::kPerValueHead,
          .output_gate = GateActivation::kSilu};
}

DeltaRuleGeometry DeltaRuleGeometry::Mamba2(int64_t hidden, int heads, int head_dim, int state, int groups,
                                            int conv_width, double eps) {
  DeltaRuleGeometry g = Gdn(hidden, groups, heads, state, head_dim, conv_width, eps);
  g.ssd = true;
  return g;
}

RecurrentStateSpec DeltaRuleGeometry::state_spec() const {
  return {.value_heads = HV,
          .head_k_dim = K,
          .head_v_dim = V,
          .conv_channels = conv_channels(),
          .conv_width = W,
          .verify_row = conv_channels() + gate_width() + HV};
}

void DeltaRuleGeometry::Validate(const std::string& who) const {
  Check(hidden >= 1 && H >= 1 && HV >= 1 && W >= 1, [&] {
    return who + ": hidden " + std::to_string(hidden) + ", key heads " + std::to_string(H) + ", value heads " +
           std::to_string(HV) + " and conv width " + std::to_string(W) + " must be positive";
  });
  Check(HV % H == 0, [&] {
    return who + ": the value heads (" + std::to_string(HV) + ") must be a multiple of the key heads (" +
           std::to_string(H) + ")";
  });
  Check(K >= 1 && K <= 256 && V >= 1 && V <= 256, [&] {
    return who + ": head dims K " + std::to_string(K) + " and V " + std::to_string(V) + " must be in [1, 256]";
  });
  Check(decay == DecayWidth::kPerValueHead || (H == HV && K == V),
        who + ": a per-key-dim decay (KDA) needs as many value heads as key heads and K == V");
  Check(rms_norm_eps > 0, who + ": rms_norm_eps must be > 0");
  Check(head_split >= 1 && (head_split == 1 || H == 1),
        who + ": a shard of a key head's value heads holds that one key head");
  Check(std::isfinite(gate_lower_bound) && gate_lower_bound <= 0.0F, [&] {
    return who + ": the gate's lower bound must be finite and < 0 (0: none), got " + std::to_string(gate_lower_bound);
  });
  Check(beta_scale == 1.0F || beta_scale == 2.0F,
        [&] { return who + ": beta_scale must be 1 or 2 (negative eigenvalues), got " + std::to_string(beta_scale); });
  Check(ssd || (ssd_norm == SsdNorm::kGateThenNorm && !ssd_scaled()),
        who + ": the norm forms and in_proj multipliers are a Mamba2 mixer's variants");
  if (!ssd) return;
  Check(decay == DecayWidth::kPerValueHead && output_gate == GateActivation::kSilu && gate_lower_bound == 0.0F &&
            beta_scale == 1.0F && !gate_in_act_dtype && !conv_weights_f32,
        who + ": a Mamba2 mixer has one decay per head, a silu gate and none of the delta-rule variants");
  Check(dt_min >= 0.0F && !(dt_max < dt_min) && !std::isnan(dt_max), [&] {
    return who + ": time_step_limit must satisfy 0 <= min <= max, got (" + std::to_string(dt_min) + ", " +
           std::to_string(dt_max) + ")";
  });
  for (float m : ssd_multipliers) {
    Check(std::isfinite(m), [&] { return who + ": the in_proj multipliers must be finite, got " + std::to_string(m); });
  }
  Check(ssd_norm == SsdNorm::kGateThenNorm || ssd_norm == SsdNorm::kNormThenGate || ssd_norm == SsdNorm::kGateOnly,
        who + ": unknown gated-norm form");
}

DeltaRuleGeometry DeltaRuleGeometry::Shard(int begin, int count, int split) const {
  Check(count >= 1 && begin >= 0 && begin + count <= H, [&] {
    return "head shard [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
           ") does not fit the layer's " + std::to_string(H) + " key heads";
  });
  Check(head_split == 1 && split >= 1 && (split == 1 || (count == 1 && group() % split == 0)), [&] {
    return "head shard: the " + std::to_string(group()) + " value heads of a key head cannot be split over " +
           std::to_string(split) + " ranks";
  });
  DeltaRuleGeometry g = *this;
  g.H = count;
  g.HV = count * group() / split;
  g.head_split = split;
  return g;
}

}  // namespace kda
