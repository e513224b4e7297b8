// RadixLinearAttention: the layer -> backend dispatch entry of a linear
// recurrent attention layer. It holds the layer's metadata (pool layer id,
// head counts and dims, conv weights, A_log, dt_bias, scale) and hands the
// layer's projections to the attention backend, which owns the states.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"

namespace kda {

class LinearRecurrentAttnBackend;

class RadixLinearAttention {
 public:
  // layer_id: this layer's index in the state pool (its ordinal among the
  // model's KDA layers). conv_weight [3, W, P]: the q, k and v convs, each
  // in the short conv kernels' tap-major layout [W, P] (short_conv.h); A_log
  // [H]; dt_bias [P]; scale multiplies q (K^-0.5).
  RadixLinearAttention(int layer_id, int num_heads, int head_k_dim, int head_v_dim, int conv_width,
                       std::vector<float> conv_weight, std::vector<float> A_log, std::vector<float> dt_bias,
                       float scale);

  // o [T, H, V] from this step's projections: mixed_qkv [T, 3P] (before the
  // conv), gate_raw [T, P] (f_b output, before dt_bias), beta_logits [T, H];
  // all in the activation dtype. The backend's metadata describes the batch.
  void Forward(LinearRecurrentAttnBackend& backend, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
               ConstBuf beta_logits) const;

  int layer_id() const { return layer_id_; }
  int num_heads() const { return num_heads_; }
  int head_k_dim() const { return head_k_dim_; }
  int head_v_dim() const { return head_v_dim_; }
  int conv_width() const { return conv_width_; }
  int64_t projection_size() const { return static_cast<int64_t>(num_heads_) * head_k_dim_; }
  const std::vector<float>& conv_weight() const { return conv_weight_; }
  const std::vector<float>& A_log() const { return A_log_; }
  const std::vector<float>& dt_bias() const { return dt_bias_; }
  float scale() const { return scale_; }

 private:
  int layer_id_;
  int num_heads_;
  int head_k_dim_;
  int head_v_dim_;
  int conv_width_;
  std::vector<float> conv_weight_;
  std::vector<float> A_log_;
  std::vector<float> dt_bias_;
  float scale_;
};

}  // namespace kda
