// DeltaRuleLayer: one delta-rule layer of a model, the layer the model, the
// runner and the benchmarks hold (models/delta_rule_layer.cc), for every
// family: its projections are cut from the checkpoint's tensors by the roles
// its family's tensor table gives their rows (kda/models/layer_weights.h) —
// q|k|v (one GEMM: the conv's channels), the raw gate and the output gate
// (each one projection, or a low-rank pair x -> [K] -> [P]), beta — and the
// rest is shared: the attention core through RadixLinearAttention and the
// backend (conv with pool tails, gate, kernel, pool states), the gated
// RMSNorm per value head (the geometry's output gate activation) and the
// output projection, with its tensor-parallel sum. The cast points are those
// of the design (§2) and ../shared/tools/gdn_ref.py.
//
// Shapes: T packed tokens, hidden model width, H key heads of K, HV value
// heads of V (DeltaRuleGeometry). Per-sequence state in the pool: its
// RecurrentStateSpec (geometry().state_spec()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  // A layer of the family whose tensor table at `geometry` is `table` (the
  // family's `layer_class`, `who`, starts messages). layer_id: the layer's
  // index in the state pool. `geometry` and `weights`: this rank's shard (the
  // whole layer without tp); kda::Error unless the weights hold every tensor
  // of the table with its size and nothing else, and the table's rows fit the
  // geometry. act_dtype F32: the fp32 pipeline; BF16: the bf16 pipeline
  // (weights rounded to bf16). Tensor parallelism: with a `tp` group of size
  // > 1 the partial output projections are summed in fp32 across the group
  // and rounded once; `tp` must outlive the layer. weights_format kInt8:
  // every projection is quantized to Q8 here (kda::Error when an input dim is
  // not a multiple of 32) unless the weights already hold Q8 values; the
  // convs, A_log, dt_bias and the norm stay as they are. The layer then
  // equals the one built from DequantizeLayerWeights with kDense, up to the
  // order of fp32 sums.
  DeltaRuleLayer(const std::string& who, const TensorTable& table, int layer_id, const DeltaRuleGeometry& geometry,
                 const LayerWeights& weights, DType act_dtype, Communicator* tp = nullptr,
                 WeightFormat weights_format = WeightFormat::kDense);
  ~DeltaRuleLayer();
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

 private:
  // The four inputs of the core and the norm, in the activation dtype.
  struct Projected;
  // A projection: one Linear, or a low-rank pair (first [K, hidden], then [rows, K]).
  struct Projection {
    const Linear* first = nullptr;
    const Linear* second = nullptr;
    // A factor per output column applied to the fp32 result before its rounding (Falcon-H1's multipliers on
    // a Mamba2 mixer's in_proj parts); empty: none.
    std::vector<float> scale;
  };

  // mixed_qkv [T, C], gate_raw [T, gate_width], beta_logits [T, HV] and
  // output_gate [T, HV*V] from x [T, hidden].
  void Project(ConstBuf x, int64_t T, Projected& out) const;
  // The projection of the rows of `roles` (in that order), after the low-rank first half of role `down`
  // where the table has one; `rows`: the geometry's count of its output rows, checked against the table.
  Projection AddRole(const LayerWeights& w, const TensorTable& table, const DeltaRuleGeometry& g,
                     const std::vector<TensorRole>& roles, std::optional<TensorRole> down, int64_t rows,
                     const std::string& what, const std::string& who);
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
  // The rows of `role` in the table's projections (`projections`) or other tensors, in table order and
  // head-major; *cols receives their tensors' columns (one value, else kda::Error).
  // conv_bias: the rows of the conv bias tensors (TensorSpec::conv_bias) instead of the other tensors'.
  static std::vector<RowBlock> RoleRows(const TensorTable& table, TensorRole role, bool projections, int key_heads,
                                        int64_t* cols, bool conv_bias = false);
  void CheckInputDtype(ConstBuf x) const;

  DType act_dtype_;
  WeightFormat weights_format_;
  Communicator* tp_ = nullptr;
  std::vector<std::unique_ptr<Linear>> projections_;  // the input projections
  Projection qkv_proj_;
  Projection gate_proj_;
  Projection beta_proj_;
  Projection out_gate_proj_;
  std::unique_ptr<Linear> out_proj_;
  std::unique_ptr<RadixLinearAttention> attn_;
  std::vector<float> norm_weight_;  // [V] (a Mamba2 mixer's: [HV * V]; empty without a norm)
};

}  // namespace kda
