// KimiDeltaAttention: one KDA layer of Kimi-Linear, GLM-5 Next or Bailing
// hybrid (design §2), a DeltaRuleLayer whose projections are q/k/v_proj (one
// fused GEMM), the forget gate (low-rank f_a -> f_b, or full-rank f_proj; one
// decay per key dimension), b_proj (beta) and the output gate (low-rank
// g_a -> g_b, or full-rank g_proj; sigmoid), for the fp32
// pipeline and the bf16 pipeline with the cast points of design §2
// (models/kimi_linear/kimi_delta_attention.cc). Its tensor table:
// KimiDeltaAttentionTensors.
//
// Shapes: hidden model width, H heads of K = V dims, P = H*K, W conv width.
#pragma once

#include "kda/base/dtype.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_layer.h"
#include "kda/models/layer_weights.h"

namespace kda {

class Communicator;

// The checkpoint layouts of a KDA layer:
// - kKimi, `model.layers.{i}.self_attn.*` of Kimi-Linear and GLM-5 Next:
//   q/k/v_proj [P, hidden], q/k/v_conv1d [P, 1, W], f_a_proj [K, hidden],
//   f_b_proj [P, K], b_proj [H, hidden], g_a_proj [K, hidden], g_b_proj
//   [P, K], o_norm [V], o_proj [hidden, P], A_log [1, 1, H, 1] (or [H]),
//   dt_bias [P]. Heads shard q/k/v, the convs, f_b, b, g_b, A_log, dt_bias
//   and o_proj's input columns; f_a, g_a and o_norm are replicated.
// - kBailing, `model.layers.{i}.attention.*` of Bailing hybrid (Ling): as
//   kKimi with full-rank gates f_proj [P, hidden] and g_proj [P, hidden]
//   (sharded by rows) and the output projection named dense [hidden, P].
enum class KdaLayout : uint8_t { kKimi, kBailing };

// The layout's tensor table (geometry: the full layer's).
TensorTable KimiDeltaAttentionTensors(const DeltaRuleGeometry& g, KdaLayout layout = KdaLayout::kKimi);

class KimiDeltaAttention : public DeltaRuleLayer {
 public:
  // layer_id: the layer's index in the state pool. `geometry` and `weights`:
  // this rank's shard (the whole layer without tp). weights_format kInt8:
  // every projection is quantized to Q8 here (kda::Error when an input dim is
  // not a multiple of 32) unless the weights already hold Q8 values; the
  // convs, A_log, dt_bias and o_norm stay as they are. The layer then equals
  // the one built from DequantizeLayerWeights with kDense, up to the order of
  // fp32 sums.
  KimiDeltaAttention(int layer_id, const DeltaRuleGeometry& geometry, const LayerWeights& weights, DType act_dtype,
                     Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);
  // The same for a checkpoint of `layout`.
  KimiDeltaAttention(KdaLayout layout, int layer_id, const DeltaRuleGeometry& geometry, const LayerWeights& weights,
                     DType act_dtype, Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);

 protected:
  void Project(ConstBuf x, int64_t T, Projected& out) const override;

 private:
  // The forget gate's and the output gate's projections: {x -> P} or low-rank {x -> K, K -> P}.
  const Linear* f_proj_[2] = {nullptr, nullptr};
  const Linear* g_proj_[2] = {nullptr, nullptr};
};

}  // namespace kda
