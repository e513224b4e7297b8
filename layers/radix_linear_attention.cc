#include "kda/layers/radix_linear_attention.h"

#include <string>
#include <utility>

#include "kda/base/error.h"

namespace kda {

RadixLinearAttention::RadixLinearAttention(int layer_id, const DeltaRuleGeometry& geometry,
                                           std::vector<float> conv_weight, std::vector<float> A_log,
                                           std::vector<float> dt_bias, float scale, std::vector<float> conv_bias,
                                           std::vector<float> D)
    : layer_id_(layer_id),
      geometry_(geometry),
      conv_weight_(std::move(conv_weight)),
      A_log_(std::move(A_log)),
      dt_bias_(std::move(dt_bias)),
      scale_(scale),
      conv_bias_(std::move(conv_bias)),
      D_(std::move(D)) {
  Check(layer_id >= 0, "RadixLinearAttention: negative layer id");
  geometry.Validate("RadixLinearAttention");
  Check(static_cast<int64_t>(conv_weight_.size()) == geometry.conv_channels() * geometry.W,
        "RadixLinearAttention: conv weight must be [W, C] per q, k and v group");
  Check(static_cast<int64_t>(A_log_.size()) == geometry.HV, "RadixLinearAttention: A_log must be [HV]");
  Check(static_cast<int64_t>(dt_bias_.size()) == geometry.gate_width(),
        "RadixLinearAttention: dt_bias must have one entry per gate value (KDA [HV*K], GDN [HV])");
  if (geometry.ssd) {
    Check(static_cast<int64_t>(conv_bias_.size()) == geometry.conv_channels(),
          "RadixLinearAttention: a Mamba2 mixer's conv bias must be [C]");
    Check(static_cast<int64_t>(D_.size()) == geometry.HV, "RadixLinearAttention: a Mamba2 mixer's D must be [HV]");
    Check(scale_ == 1.0F, "RadixLinearAttention: a Mamba2 mixer reads C unscaled (scale 1)");
  } else {
    Check(conv_bias_.empty() && D_.empty(), "RadixLinearAttention: a conv bias and D belong to Mamba2 mixers");
  }
}

}  // namespace kda
