// RadixLinearAttention: what the attention backend needs of one linear
// recurrent attention layer (pool layer id, geometry, conv weights, A_log,
// dt_bias, scale), checked once when it is made; the layer hands it with its
// projections to the backend (LinearRecurrentAttnBackend::Forward), which owns
// the states.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/layers/delta_rule_geometry.h"

namespace kda {

class RadixLinearAttention {
 public:
  // layer_id: this layer's index in the state pool (its ordinal among the
  // model's delta-rule layers). conv_weight: the q, k and v convs one after
  // the other, each in the short conv kernels' tap-major layout [W, C_g]
  // (short_conv.h; C_g = H*K, H*K, HV*V); A_log [HV]; dt_bias
  // [geometry.gate_width()] (KDA [HV*K], GDN [HV]); scale multiplies q (K^-0.5).
  RadixLinearAttention(int layer_id, const DeltaRuleGeometry& geometry, std::vector<float> conv_weight,
                       std::vector<float> A_log, std::vector<float> dt_bias, float scale);

  int layer_id() const { return layer_id_; }
  const DeltaRuleGeometry& geometry() const { return geometry_; }
  const std::vector<float>& conv_weight() const { return conv_weight_; }
  const std::vector<float>& A_log() const { return A_log_; }
  const std::vector<float>& dt_bias() const { return dt_bias_; }
  float scale() const { return scale_; }

 private:
  int layer_id_;
  DeltaRuleGeometry geometry_;
  std::vector<float> conv_weight_;
  std::vector<float> A_log_;
  std::vector<float> dt_bias_;
  float scale_;
};

}  // namespace kda
