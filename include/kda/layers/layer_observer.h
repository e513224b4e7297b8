// LayerObserver: read-only access to the tensors of a forward pass, for
// traces, self-checks and golden tests. Set on the attention backend (or a
// ModelRunner, which sets it on its backend); the layers and the backend show
// it their tensors as they are computed. No observer: nothing is copied.
#pragma once

#include <cstdint>

#include "kda/base/buffer.h"

namespace kda {

struct ForwardBatch;

// The tensors of one KDA layer's forward pass, T tokens of the batch, P = H*K.
// In the activation dtype unless marked fp32.
enum class LayerTensor : uint8_t {
  kInput,       // [T, hidden] the layer's input
  kQConv,       // [T, H, K] q after the short conv + SiLU
  kKConv,       // [T, H, K] k after the short conv + SiLU
  kVConv,       // [T, H, V] v after the short conv + SiLU
  kGateRaw,     // [T, H, K] f_b_proj output (before dt_bias)
  kGate,        // [T, H, K] fp32 log decay g
  kBeta,        // [T, H] fp32 beta
  kCoreOutput,  // [T, H, V] the KDA kernel's output
  kOutputGate,  // [T, H, V] g_b_proj output (the gated RMSNorm's gate)
  kOutput,      // [T, hidden] the layer's output
};

class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // A batch's metadata was set (before any of its layers runs).
  virtual void OnBatch(const ForwardBatch& /*batch*/) {}
  // Layer `layer_id` (its pool layer index) computed `which`: `count` values
  // of `values.dtype`, readable only during the call.
  virtual void OnTensor(int layer_id, LayerTensor which, ConstBuf values, int64_t count) = 0;
};

}  // namespace kda
