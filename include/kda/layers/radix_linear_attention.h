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
  // A Mamba2 mixer (geometry.ssd): conv_weight x|B|C in that order, its conv
  // bias [C] in the same order, D [HV] (y = o + D x), scale 1; empty otherwise.
  RadixLinearAttention(int layer_id, const DeltaRuleGeometry& geometry, std::vector<float> conv_weight,
                       std::vector<float> A_log, std::vector<float> dt_bias, float scale,
                       std::vector<float> conv_bias = {}, std::vector<float> D = {});

  int layer_id() const { return layer_id_; }
  const DeltaRuleGeometry& geometry() const { return geometry_; }
  const std::vector<float>& conv_weight() const { return conv_weight_; }
  const std::vector<float>& A_log() const { return A_log_; }
  const std::vector<float>& dt_bias() const { return dt_bias_; }
  float scale() const { return scale_; }
  const std::vector<float>& conv_bias() const { return conv_bias_; }
  const std::vector<float>& D() const { return D_; }

 private:
  int layer_id_;
  DeltaRuleGeometry geometry_;
  std::vector<float> conv_weight_;
  std::vector<float> A_log_;
  std::vector<float> dt_bias_;
  float scale_;
  std::vector<float> conv_bias_;
  std::vector<float> D_;
};

}  // namespace kda
