// KimiDeltaAttention: one KDA layer of Kimi-Linear (design §2), for the fp32
// pipeline and the bf16 pipeline with the cast points of design §2; its
// weights, and KdaModel, the KDA layers of a model loaded from a checkpoint.
//
// Shapes: T packed tokens, N sequences, hidden model width, H heads, K = V
// head dim, P = H*K, W conv width. Per-sequence state: the recurrent state
// [H, K, V] fp32 and the conv tail [W-1, 3P] (channels q|k|v, rows oldest
// first; the raw projection outputs before SiLU) in the activation dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kda/base/buffer.h"
#include "kda/base/dtype.h"
#include "kda/base/kda_layer_shape.h"
#include "kda/kernels/gemm.h"
#include "kda/kernels/q8.h"
#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/radix_linear_attention.h"

namespace kda {

class Checkpoint;
class Communicator;
struct KimiLinearConfig;

// Kimi-Linear-48B-A3B's KDA layer: hidden 2304, 32 heads of 128, conv width 4,
// RMSNorm eps 1e-5 (the embedded default model and the benchmarks' shape).
constexpr KdaLayerShape KimiLinear48BLayerShape() {
  KdaLayerShape s;
  s.hidden = 2304;
  s.H = 32;
  s.K = 128;
  s.W = 4;
  s.rms_norm_eps = 1e-5;
  return s;
}

// The Linear projections of one layer in Q8 form, as a `kda quantize`
// checkpoint holds them (layouts as in KdaLayerWeights).
struct KdaLayerQ8Weights {
  Q8Weight q_proj, k_proj, v_proj, f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, o_proj;
};

// One layer's weights as fp32 values, Hugging Face layouts (Linear [out, in]).
// With `q8` set (an int8 checkpoint), the projections are there and the
// projection vectors here are empty.
struct KdaLayerWeights {
  std::vector<float> q_proj, k_proj, v_proj;  // [P, hidden]
  std::vector<float> q_conv, k_conv, v_conv;  // [P, W] (checkpoint [P, 1, W])
  std::vector<float> f_a_proj;                // [K, hidden]
  std::vector<float> f_b_proj;                // [P, K]
  std::vector<float> b_proj;                  // [H, hidden]
  std::vector<float> g_a_proj;                // [K, hidden]
  std::vector<float> g_b_proj;                // [P, K]
  std::vector<float> A_log;                   // [H] (checkpoint [1, 1, H, 1] or [H])
  std::vector<float> dt_bias;                 // [P], index h*K + d
  std::vector<float> o_norm;                  // [V]
  std::vector<float> o_proj;                  // [hidden, P]
  std::optional<KdaLayerQ8Weights> q8;
};

// The weights with every Linear projection replaced by its Q8 round trip,
// DequantizeQ8(QuantizeQ8(w)) (exact fp32 values): what a kInt8 layer
// multiplies by (rounded to bf16 in the bf16 pipeline). kda::Error as
// QuantizeQ8.
KdaLayerWeights DequantizeKdaLayerWeights(const KdaLayerWeights& w, const KdaLayerShape& shape);

// The names of the Linear projections, as in `model.layers.{i}.self_attn.{name}.weight`.
const std::vector<std::string>& KdaProjectionNames();

// `kda quantize`: writes output_dir (config.json copied, model.safetensors)
// with every KDA layer of the checkpoint in model_dir: each projection as
// `model.layers.{i}.self_attn.{name}.weight` (I8 [out, in]) and
// `...{name}.weight_scale` (F16 [out, in / 32]), the other KDA tensors as
// they are. Other layers' tensors are not written. kda::Error (nothing
// written) when output_dir exists and is not empty, and as QuantizeQ8.
void QuantizeKdaCheckpoint(const std::string& model_dir, const std::string& output_dir);

// The layer's shape from the config (layer-independent).
KdaLayerShape KdaLayerShapeFromConfig(const KimiLinearConfig& config);

// Reads `model.layers.{layer}.self_attn.*` (0-based layer, which must be a
// KDA layer) and checks every tensor's presence, dtype and shape, and that
// every value read is finite (a NaN or infinity is a kda::Error naming the
// checkpoint key and the element). Weights built otherwise are not checked.
KdaLayerWeights LoadKdaLayerWeights(const Checkpoint& ckpt, const KimiLinearConfig& config, int layer);

// Deterministic random weights with the statistics of an initialised model
// (every value bf16-representable), for benchmarks and the embedded default.
KdaLayerWeights RandomKdaLayerWeights(const KdaLayerShape& shape, uint64_t seed);

// Tensor parallelism over heads: the heads [begin, begin + count) of `total`
// that one rank of a tp group owns.
struct KdaHeadShard {
  int begin = 0;
  int count = 0;
  int total = 0;
};

// Rank `rank` of a tp group of `size` ranks: total_heads / size consecutive
// heads. kda::Error when `size` does not divide total_heads.
KdaHeadShard MakeKdaHeadShard(int total_heads, int rank, int size);

// The shape of a shard's layer: H = shard.count, everything else unchanged.
KdaLayerShape ShardLayerShape(const KdaLayerShape& full, const KdaHeadShard& shard);

// A run of elements [begin, end) (flat, row-major) read from checkpoint tensor `name`.
struct TensorRead {
  std::string name;
  int64_t begin = 0;
  int64_t end = 0;
};

// A checkpoint written by QuantizeKdaCheckpoint is read into `q8` (its
// scales checked finite and >= 0, its values in [-127, 127]).
//
// Like LoadKdaLayerWeights, but reads only the shard's part from the
// checkpoint (every tensor's full shape is still checked): the rows of
// q/k/v_proj, q/k/v_conv1d, f_b_proj, g_b_proj and b_proj and the entries of
// A_log and dt_bias that belong to its heads; of o_proj the input columns of
// its heads ([hidden, shard P]: its partial outputs are summed across the
// group); f_a_proj, g_a_proj and o_norm whole. The result has the layout of
// KdaLayerWeights for ShardLayerShape. `reads` (optional) receives each run
// of elements read.
KdaLayerWeights LoadKdaLayerWeights(const Checkpoint& ckpt, const KimiLinearConfig& config, int layer,
                                    const KdaHeadShard& shard, std::vector<TensorRead>* reads = nullptr);

// The same shard cut from full weights of shape `full` (for random models).
KdaLayerWeights ShardKdaLayerWeights(const KdaLayerWeights& w, const KdaLayerShape& full, const KdaHeadShard& shard);

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

  const KdaLayerShape& shape() const { return shape_; }
  DType act_dtype() const { return act_dtype_; }
  WeightFormat weights_format() const { return qkv_proj_->weight_format(); }
  // Bytes of projection weights (and Q8 scales) one forward streams.
  int64_t projection_weight_bytes() const;
  const RadixLinearAttention& attn() const { return *attn_; }

 private:
  KdaLayerShape shape_;
  DType act_dtype_;
  std::unique_ptr<Linear> qkv_proj_, f_a_proj_, f_b_proj_, b_proj_, g_a_proj_, g_b_proj_, o_proj_;
  std::unique_ptr<RadixLinearAttention> attn_;
  std::vector<float> o_norm_;  // [V]
  Communicator* tp_ = nullptr;
};

// The KDA layers of one model, in model order; layers[i] uses pool layer i.
//
// Tensor parallelism: with a `tp` group of size > 1 the model is this rank's
// shard: `shape` (and so the pool a runner needs) has only its heads
// `heads`, and each layer sums its o_proj partials over `tp`.
struct KdaModel {
  KdaLayerShape shape;  // this rank's heads: shape.H = heads.count
  DType act_dtype = DType::kF32;
  WeightFormat weights_format = WeightFormat::kDense;  // of the projections
  KdaHeadShard heads;                                  // the heads held, of heads.total (all of them without tp)
  Communicator* tp = nullptr;                          // the tp group (null: one rank); must outlive the model
  std::vector<int> model_layer_ids;                    // 0-based checkpoint layer index of each KDA layer
  std::vector<KimiDeltaAttention> layers;

  // Every KDA layer of a checkpoint (config.json + safetensors), or only
  // `only_layer` (0-based; it must be a KDA layer). With a `tp` group, only
  // tp rank r's heads are read (kda::Error when tp->size() does not divide
  // the number of heads). Weights holding a NaN or infinity are refused
  // (kda::Error naming the checkpoint key and element). weights_format
  // kInt8: the projections are quantized as they load (each tp rank
  // quantizes only its slices).
  static KdaModel Load(const std::string& model_dir, DType act_dtype, std::optional<int> only_layer = std::nullopt,
                       Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);
  // `num_layers` layers of deterministic random weights (the same full
  // weights on every rank; a `tp` rank keeps its heads' shard).
  static KdaModel Random(const KdaLayerShape& shape, int num_layers, DType act_dtype, uint64_t seed,
                         Communicator* tp = nullptr, WeightFormat weights_format = WeightFormat::kDense);

  int num_layers() const { return static_cast<int>(layers.size()); }
  // The unsharded model's shape (heads.total heads).
  KdaLayerShape full_shape() const;
};

}  // namespace kda
