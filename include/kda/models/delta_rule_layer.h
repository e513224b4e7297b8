// DeltaRuleLayer: one delta-rule layer of a model, the abstract layer the
// model, the runner and the benchmarks hold (models/delta_rule_layer.cc). A
// layer type (KimiDeltaAttention, GatedDeltaNet) supplies its projections of
// the input; the rest is shared: the attention core through
// RadixLinearAttention and the backend (conv with pool tails, gate, kernel,
// pool states), the gated RMSNorm per value head (the geometry's output gate
// activation) and the output projection, with its tensor-parallel sum.
//
// Shapes: T packed tokens, hidden model width, H key heads of K, HV value
// heads of V (DeltaRuleGeometry). Per-sequence state in the pool: its
// RecurrentStateSpec (geometry().state_spec()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/linear.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/layers/radix_linear_attention.h"
#include "kda/models/layer_weights.h"

namespace kda {

class Communicator;
class LinearRecurrentAttnBackend;

class DeltaRuleLayer {
 public:
  virtual ~DeltaRuleLayer();
  DeltaRuleLayer(const DeltaRuleLayer&) = delete;
  DeltaRuleLayer& operator=(const DeltaRuleLayer&) = delete;

  // out [T, hidden] = the layer applied to x [T, hidden] (both in the
  // activation dtype) for the batch the backend's metadata describes (T =
  // metadata().num_tokens). Reads and updates this layer's states in the pool.
  // Throws kda::Error on bad input before writing anything. Values are not
  // checked: a NaN or infinity in x or in the pool's states propagates (this
  // is the hot path, like the kernels under it; untrusted data is checked
  // where it enters, e.g. `kda run`'s input file and LoadLayerWeights).
  // The backend's observer, if any, is shown the layer's tensors (LayerTensor).
  void Forward(MutBuf out, ConstBuf x, LinearRecurrentAttnBackend& backend) const;

  // The layer's projection GEMMs alone, the Linears Forward runs on the same
  // inputs, with the output projection on a [T, HV*V] input. The outputs are
  // discarded (without a tensor-parallel sum). For benchmarks that time the
  // projections apart from the core (`kda bench-kernels --only projections`).
  // Throws kda::Error on a bad x.
  void ForwardProjections(ConstBuf x, int64_t T) const;

  const DeltaRuleGeometry& geometry() const { return attn_->geometry(); }
  DType act_dtype() const { return act_dtype_; }
  WeightFormat weights_format() const { return out_proj_->weight_format(); }
  // Bytes of projection weights (and Q8 scales) one forward streams.
  int64_t projection_weight_bytes() const;
  const RadixLinearAttention& attn() const { return *attn_; }

  // The four inputs of the core and the norm, in the activation dtype.
  struct Projected;

 protected:
  // act_dtype F32: the fp32 pipeline; BF16: the bf16 pipeline (weights
  // rounded to bf16). Tensor parallelism: with a `tp` group of size > 1 the
  // layer is this rank's shard (its key heads and their value heads); the
  // partial output projections are summed in fp32 across the group and
  // rounded once. `tp` must outlive the layer.
  DeltaRuleLayer(DType act_dtype, Communicator* tp, WeightFormat weights_format);

  // mixed_qkv [T, C], gate_raw [T, gate_width], beta_logits [T, HV] and
  // output_gate [T, HV*V] from x [T, hidden].
  virtual void Project(ConstBuf x, int64_t T, Projected& out) const = 0;

  // kda::Error naming the tensor unless `w` holds every tensor of `table`
  // (the layer type's table at this layer's geometry) with its size (a Q8
  // tensor: its rows and cols), and nothing else. `who` starts the message.
  static void CheckWeights(const LayerWeights& w, const TensorTable& table, const std::string& who);
  // A block of rows [r0, r1) of the weight tensor `name` ([rows, cols]).
  struct RowBlock {
    std::string name;
    int64_t r0 = 0, r1 = 0;
  };
  // A projection whose weight is `blocks` one after another (all with `cols`
  // columns), in the layer's weight format: the checkpoint's Q8 values when
  // the weights hold them, else quantized here with kInt8 (kda::Error when
  // cols is not a multiple of 32), else dense. Kept for
  // projection_weight_bytes.
  const Linear& AddProjection(const LayerWeights& w, const std::vector<RowBlock>& blocks, int64_t cols,
                              const std::string& what);
  // Sets what the shared part needs: the output projection [hidden, HV*V]
  // (tensor `out_name`), the core, and the norm weight [V].
  void SetCore(const LayerWeights& w, const std::string& out_name, std::unique_ptr<RadixLinearAttention> attn,
               std::vector<float> norm_weight);
  // The convs in the backend's layout from a checkpoint's [C_g, W] rows per q,
  // k, v group (rounded to bf16 in the bf16 pipeline unless the geometry keeps
  // them fp32).
  std::vector<float> ConvWeight(const std::vector<const std::vector<float>*>& groups,
                                const DeltaRuleGeometry& geometry) const;
  void CheckInputDtype(ConstBuf x) const;

  // The projections every layer type has (set by its constructor through
  // AddProjection): q|k|v, the conv's channels (mixed_qkv), and b (beta_logits).
  const Linear* qkv_proj_ = nullptr;
  const Linear* b_proj_ = nullptr;

 private:
  DType act_dtype_;
  WeightFormat weights_format_;
  Communicator* tp_ = nullptr;
  std::vector<std::unique_ptr<Linear>> projections_;  // the input projections, in Project's order
  std::unique_ptr<Linear> out_proj_;
  std::unique_ptr<RadixLinearAttention> attn_;
  std::vector<float> norm_weight_;  // [V]
};

}  // namespace kda
