#include "kda/layers/radix_linear_attention.h"

#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"

namespace kda {

RadixLinearAttention::RadixLinearAttention(int layer_id, int num_heads, int head_k_dim, int head_v_dim, int conv_width,
                                           std::vector<float> conv_weight, std::vector<float> A_log,
                                           std::vector<float> dt_bias, float scale)
    : layer_id_(layer_id),
      num_heads_(num_heads),
      head_k_dim_(head_k_dim),
      head_v_dim_(head_v_dim),
      conv_width_(conv_width),
      conv_weight_(std::move(conv_weight)),
      A_log_(std::move(A_log)),
      dt_bias_(std::move(dt_bias)),
      scale_(scale) {
  Check(layer_id >= 0 && num_heads >= 1 && head_k_dim >= 1 && conv_width >= 1, "RadixLinearAttention: bad shape");
  Check(head_k_dim == head_v_dim, "RadixLinearAttention: KDA needs head_k_dim == head_v_dim");
  const int64_t p = projection_size();
  Check(static_cast<int64_t>(conv_weight_.size()) == 3 * p * conv_width,
        "RadixLinearAttention: conv weight must be [3, W, P]");
  Check(static_cast<int64_t>(A_log_.size()) == num_heads, "RadixLinearAttention: A_log must be [H]");
  Check(static_cast<int64_t>(dt_bias_.size()) == p, "RadixLinearAttention: dt_bias must be [P]");
}

void RadixLinearAttention::Forward(LinearRecurrentAttnBackend& backend, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                                   ConstBuf beta_logits) const {
  backend.Forward(*this, o, mixed_qkv, gate_raw, beta_logits);
}

}  // namespace kda
