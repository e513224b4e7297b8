// KimiDeltaAttention: one KDA layer of Kimi-Linear (design §2), for the fp32
// pipeline and the bf16 pipeline with the cast points of design §2
// (models/kimi_linear/kimi_delta_attention.cc). Weights: weights.h.
//
// Shapes: T packed tokens, N sequences, hidden model width, H heads, K = V
// head dim, P = H*K, W conv width. Per-sequence state: the recurrent state
// [H, K, V] fp32 and the conv tail [W-1, 3P] (channels q|k|v, rows oldest
// first; the raw projection outputs before SiLU) in the activation dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/kda_layer_shape.h"
#include "kda/kernels/linear.h"
#include "kda/layers/radix_linear_attention.h"
#include "kda/models/weights.h"

namespace kda {

class Communicator;
class LinearRecurrentAttnBackend;

// One KDA layer: projections, then the attention core through
// RadixLinearAttention and the backend (conv with pool tails, gates, kernel,
// pool states), then the gated RMSNorm and o_proj.
class KimiDeltaAttention {
 public:
  // layer_id: the layer's index in the state pool. act_dtype F32: the fp32
  // pipeline; BF16: the bf16 pipeline (weights rounded to bf16).
  //
  // weights_format kInt8: every Linear projection (q/k/v/o_proj, f_a/f_b,
  // g_a/g_b, b_proj) is quantized here to Q8 (kda/kernels/q8.h; kda::Error
  // when an input dim is not a multiple of 32); the convs, A_log, dt_bias and
  // o_norm stay as they are. The layer then equals this class built from the
  // dequantized weights (DequantizeKdaLayerWeights) with kDense, up to the
  // order of fp32 sums.
  //
  // Tensor parallelism: with a `tp` group of size > 1, `shape` and `weights`
  // are this rank's shard (shape.H = its heads; o_proj [hidden, its P]); the
  // partial o_proj outputs are summed in fp32 across the group and rounded
  // once, so every rank ends with the full output. `tp` must outlive the layer.
  KimiDeltaAttention(int layer_id, const KdaLayerShape& shape, const KdaLayerWeights& weights, DType act_dtype,
                     Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);
  ~KimiDeltaAttention();
  KimiDeltaAttention(KimiDeltaAttention&&) noexcept;
  KimiDeltaAttention& operator=(KimiDeltaAttention&&) noexcept;

  // out [T, hidden] = the layer applied to x [T, hidden] (both in the
  // activation dtype) for the batch the backend's metadata describes (T =
  // metadata().num_tokens). Reads and updates this layer's states in the pool.
  // Throws kda::Error on bad input before writing anything. Values are not
  // checked: a NaN or infinity in x or in the pool's states propagates (this
  // is the hot path, like the kernels under it; untrusted data is checked
  // where it enters, e.g. `kda run`'s input file and LoadKdaLayerWeights).
  // The backend's observer, if any, is shown the layer's tensors (LayerTensor).
  void Forward(MutBuf out, ConstBuf x, LinearRecurrentAttnBackend& backend) const;

  // The layer's projection GEMMs alone, the Linears Forward runs on the same
  // inputs: q/k/v (fused), f_a, b, g_a on x [T, hidden] (activation dtype),
  // f_b and g_b on f_a's and g_a's outputs, and o_proj on a [T, P] input (f_b's
  // output here, the normed core output in Forward). The outputs are discarded
  // (without a tensor-parallel sum). For benchmarks that time the projections
  // apart from the core (`kda bench-kernels --only projections`). Throws
  // kda::Error on a bad x.
  void ForwardProjections(ConstBuf x, int64_t T) const;

  const KdaLayerShape& shape() const { return shape_; }
  DType act_dtype() const { return act_dtype_; }
  WeightFormat weights_format() const { return qkv_proj_->weight_format(); }
  // Bytes of projection weights (and Q8 scales) one forward streams.
  int64_t projection_weight_bytes() const;
  const RadixLinearAttention& attn() const { return *attn_; }

 private:
  KdaLayerShape shape_;
  DType act_dtype_;
  struct Projected;  // the outputs of the projections before the core
  // kda::Error unless x holds the layer's activation dtype (Forward, ForwardProjections).
  void CheckInputDtype(ConstBuf x) const;
  // The projections that read x [T, hidden] and their f_b, g_b (Forward's first step).
  Projected ProjectInputs(ConstBuf x, int64_t T) const;

  std::unique_ptr<Linear> qkv_proj_, f_a_proj_, f_b_proj_, b_proj_, g_a_proj_, g_b_proj_, o_proj_;
  std::unique_ptr<RadixLinearAttention> attn_;
  std::vector<float> o_norm_;  // [V]
  Communicator* tp_ = nullptr;
};

}  // namespace kda
