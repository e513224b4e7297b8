// DeltaRuleLayer::Projected: the buffers a layer type's projections fill (private to models/).
#pragma once

#include "base/act_buffer.h"
#include "kda/models/delta_rule_layer.h"

namespace kda {

struct DeltaRuleLayer::Projected {
  ActBuffer mixed_qkv;    // [T, C] the conv inputs q|k|v
  ActBuffer gate_raw;     // [T, gate_width] before dt_bias
  ActBuffer beta_logits;  // [T, HV]
  ActBuffer output_gate;  // [T, HV * V] the gated norm's gate input
  ActBuffer scratch[2];   // intermediates of low-rank projections
};

}  // namespace kda
