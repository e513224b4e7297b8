// Small layers of every supported family, for the serving tests: a family's
// variant settings (those of its reference layer: decay width, output gate,
// gate lower bound, beta scale, bf16 cast points) at test sizes.
#pragma once

#include <string>
#include <tuple>

#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/layer_family.h"

namespace kda::testing {

// `model_type`'s layer with the sizes (hidden, heads, head dims, conv width,
// eps) of `sizes`; a KDA family needs a KDA `sizes` (H == HV, K == V).
inline DeltaRuleGeometry FamilyGeometry(const std::string& model_type, const DeltaRuleGeometry& sizes) {
  DeltaRuleGeometry g = LayerFamilyFor(model_type).reference;
  std::tie(g.hidden, g.H, g.HV, g.K, g.V, g.W, g.rms_norm_eps) =
      std::tie(sizes.hidden, sizes.H, sizes.HV, sizes.K, sizes.V, sizes.W, sizes.rms_norm_eps);
  if (model_type == "falcon_h1") {  // its variants on (the reference's multipliers are ones: per checkpoint)
    g.ssd_norm = SsdNorm::kNormThenGate;
    g.ssd_multipliers = {1.5F, 0.5F, 2.0F, 0.25F, 0.75F};
  }
  return g;
}

// Whether `model_type`'s layers are KDA ones (a decay per key dimension).
inline bool IsKdaFamily(const std::string& model_type) {
  return LayerFamilyFor(model_type).reference.decay == DecayWidth::kPerKeyDim;
}

}  // namespace kda::testing
