// The weights of one KDA layer of Kimi-Linear (models/kimi_linear/weights.cc):
// loaded from a Hugging Face checkpoint (whole, or one tensor-parallel rank's
// heads), made at random, sharded, and their int8 round trip.
//
// Shapes: T packed tokens, N sequences, hidden model width, H heads, K = V
// head dim, P = H*K, W conv width. Per-sequence state: the recurrent state
// [H, K, V] fp32 and the conv tail [W-1, 3P] (channels q|k|v, rows oldest
// first; the raw projection outputs before SiLU) in the activation dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kda/base/kda_layer_shape.h"
#include "kda/kernels/q8.h"

namespace kda {

class Checkpoint;
struct KimiLinearConfig;

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

}  // namespace kda
