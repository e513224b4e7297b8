// The shape of one KDA layer: what the layer, its weights and its per-request
// states in the pool are sized by.
#pragma once

#include <cstdint>

namespace kda {

// hidden model width, H heads of K x V with K = V, conv width W, P = H*K.
// Per sequence: the recurrent state [H, K, V] fp32 and the conv tail
// [W-1, 3P] (channels q|k|v) in the activation dtype.
struct KdaLayerShape {
  int64_t hidden = 0;
  int H = 0;
  int K = 0;  // = V
  int W = 0;  // short conv width
  double rms_norm_eps = 1e-5;

  int64_t P() const { return static_cast<int64_t>(H) * K; }
  int64_t ConvChannels() const { return 3 * P(); }
  int64_t RecurrentStateSize() const { return static_cast<int64_t>(H) * K * K; }          // per sequence
  int64_t ConvStateSize() const { return static_cast<int64_t>(W - 1) * ConvChannels(); }  // per sequence
};

}  // namespace kda
