// The states a KDA layer step leaves in a state pool, read back for the layer tests.
#pragma once

#include <cstdint>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/dtype.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"

namespace kda::testing {

// Layer 0's states of requests 0 .. n-1, as fp32, appended one request after
// another: recurrent [n, HV, K, V] to `rec`, conv [n, W-1, C] (C conv
// channels, stored as conv_dtype) to `conv`.
inline void AppendLayerStates(const RecurrentStatePool& pool, const HybridReqToTokenPool& req_pool, int64_t n,
                              DType conv_dtype, std::vector<float>& rec, std::vector<float>& conv) {
  const int64_t rs = pool.spec().recurrent_size();
  ActBuffer tail(conv_dtype, pool.spec().conv_size());
  std::vector<float> state(static_cast<size_t>(rs));
  for (int64_t i = 0; i < n; ++i) {
    pool.GetLayerState(0, req_pool.SlotOf(i), state.data(), tail.data());
    rec.insert(rec.end(), state.begin(), state.end());
    const std::vector<float> c = tail.ToFloat();
    conv.insert(conv.end(), c.begin(), c.end());
  }
}

}  // namespace kda::testing
