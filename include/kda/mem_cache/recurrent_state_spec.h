// What one layer's recurrent state is, in sizes only: what the state pool, the
// prefix cache, the scheduler and the parallel code allocate and copy per
// request. A layer type declares it (DeltaRuleGeometry::state_spec()); the
// storage does not know which model it serves.
#pragma once

#include <cstdint>

namespace kda {

// Per request and layer: the recurrent state [value_heads, head_k_dim,
// head_v_dim] fp32 and the conv tail [conv_width - 1, conv_channels] in the
// activation dtype; with a verify area, verify_row activation-dtype elements
// per kept position (what a commit reruns from).
struct RecurrentStateSpec {
  int value_heads = 0;
  int head_k_dim = 0;
  int head_v_dim = 0;
  int64_t conv_channels = 0;
  int conv_width = 0;
  int64_t verify_row = 0;

  int64_t recurrent_size() const { return int64_t{value_heads} * head_k_dim * head_v_dim; }
  int64_t conv_size() const { return int64_t{conv_width - 1} * conv_channels; }
  bool valid() const {
    return value_heads >= 1 && head_k_dim >= 1 && head_v_dim >= 1 && conv_channels >= 1 && conv_width >= 1 &&
           verify_row >= 0;
  }
  bool operator==(const RecurrentStateSpec&) const = default;
};

}  // namespace kda
