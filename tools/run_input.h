// The input file of `kda run --model`: its tensors, checked against the layer.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/io/safetensors.h"
#include "kda/layers/delta_rule_geometry.h"

namespace kda::cli {

// What a valid input file holds, as float (rows of the packed batch in order).
struct RunInput {
  int64_t T = 0;             // tokens
  int64_t N = 0;             // sequences
  std::vector<int64_t> cu;   // cu_seqlens [N + 1]
  std::vector<float> x;      // hidden_states [T, hidden]
  std::vector<float> rec;    // initial_recurrent_state [N, H, K, V]; empty when absent
  std::vector<float> conv;   // initial_conv_state [N, W-1, 3P]; empty when absent
  std::vector<int32_t> ids;  // input_ids [T] (the prefix cache's key); empty when absent
};

// Checks and reads `in` for a layer of `shape` (all heads): hidden_states F32 or BF16 [T, hidden]; cu_seqlens I32 or
// I64 [N + 1], from 0, non-decreasing, to T; optional initial_recurrent_state F32 [N, H, K, V] and
// initial_conv_state F32 or BF16 [N, W-1, 3P]; optional input_ids I32 or I64 [T] (values in the int32 range). Every
// value of the float tensors must be finite. Each problem is a kda::Error naming the tensor (and, for a NaN or
// infinity, the first such element).
RunInput ReadRunInput(const SafetensorsFile& in, const DeltaRuleGeometry& shape);

}  // namespace kda::cli
