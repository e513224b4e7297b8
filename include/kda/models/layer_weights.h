// The weights of one delta-rule layer as its family declares them: a tensor
// table (one entry per checkpoint tensor: Hugging Face name, shape, how
// tensor parallelism cuts it, what the layer makes of its rows, whether it is
// a quantizable projection, how a random model fills it), and the generic
// code it drives (models/layer_weights.cc): loading from a checkpoint (whole,
// or one tensor-parallel rank's heads), random init, sharding, and the int8
// round trip. The layer (models/delta_rule_layer.cc) cuts its projections,
// conv and parameters from the same table by role. A family adds a table,
// not code.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kda/kernels/q8.h"

namespace kda {

class Checkpoint;

// How tensor parallelism over key heads cuts a tensor: not at all
// (replicated), or along its rows / columns. A cut axis is the concatenation
// of parts, each holding `units` rows (columns) per key head, heads in
// order: a shard of key heads [h0, h1) keeps rows [h0*u, h1*u) of each part,
// its value heads with their key head (a part of r*V rows per key head). An
// interleaved tensor instead groups its rows by key head, each head's units
// of every part in turn (Qwen3-Next's in_proj_qkvz: q_i, k_i, v_i, z_i).
enum class ShardAxis : uint8_t { kNone, kRows, kCols };

// What the layer makes of a part of a tensor's rows: the conv's q, k and v
// channels (rows of an input projection, or of the conv weights), the raw
// gate (KDA's f [P], GDN's a [HV]), the beta logits, the output gate (KDA's
// g, GDN's z [HV*V]), a low-rank projection's first half (x -> [K], before the
// gate's or the output gate's rows [P, K]), the decay's A_log and dt_bias, the
// gated norm's weight, the output projection; Mamba2's D (y = o + D x).
enum class TensorRole : uint8_t {
  kQ,
  kK,
  kV,
  kGate,
  kBeta,
  kOutGate,
  kGateDown,
  kOutGateDown,
  kALog,
  kDtBias,
  kNorm,
  kOut,
  kD,
};

struct TensorPart {
  int64_t units = 0;  // rows (columns) per key head; a replicated tensor's one part: 0 (all of it)
  TensorRole role = TensorRole::kQ;
};

// How a random model fills a tensor (values rounded to bf16):
// kNormal N(0, a); kUniform U[a, b); kDtBias softplus^-1(dt) with dt
// log-uniform in [e^a, e^b).
struct TensorInit {
  enum class Kind : uint8_t { kNormal, kUniform, kDtBias } kind = Kind::kNormal;
  float a = 0.02F;
  float b = 0.0F;
};

struct TensorSpec {
  std::string name;                          // after the layer's prefix, e.g. "q_proj.weight"
  std::vector<std::vector<int64_t>> shapes;  // accepted checkpoint shapes (one element count); the first is canonical
  int64_t cols = 1;                          // the tensor viewed as a row-major [numel / cols, cols] matrix
  ShardAxis shard = ShardAxis::kNone;
  std::vector<TensorPart> parts;  // the cut axis's parts (a replicated tensor: one, units 0)
  bool interleaved = false;       // rows grouped by key head (see ShardAxis)
  bool quantizable = false;       // a Linear weight [out, in]: Q8 with int8 weights
  TensorInit init;
  // Non-empty: the tensor's rows and those of the table's other tensors of this group, in table order, are
  // one concatenation (transformers' loading concatenates them, e.g. OLMo hybrid's q|k|v convs into one
  // conv1d), which a checkpoint may also store split at other rows (transformers 5.25 saves OLMo's as
  // three near-equal parts): any split whose parts have the tensors' trailing dims and their rows in all.
  std::string group;
  // A conv's bias [C] (Mamba2's conv1d.bias): its parts name the conv channels' roles (q, k, v), as the conv
  // weight's do; the layer reads it apart from the weights.
  bool conv_bias = false;

  int64_t numel() const;
  int64_t rows() const { return numel() / cols; }
};

using TensorTable = std::vector<TensorSpec>;

// The key heads [begin, begin + count) of `total` that one tensor-parallel rank owns: whole key heads with
// their value heads (split 1), or, when there are more ranks than key heads, a part of one key head's value
// heads: `split` ranks share key head `begin` (count 1), rank `part` of them holding its value heads
// [part * r / split, (part + 1) * r / split) with the key head's own rows (q and k, Mamba2's B and C) whole.
struct HeadShard {
  int begin = 0;  // the first key head held
  int count = 0;  // key heads held
  int total = 0;  // the layer's key heads
  int split = 1;  // ranks sharing each key head held
  int part = 0;   // this rank's index among them
  bool whole() const { return begin == 0 && count == total && split == 1; }
  // The shard's rows [first, first + n) of a cut axis's part holding `units` per key head (heads in order),
  // relative to the part's start: a part of the key heads' own rows is kept whole, value heads' rows split.
  std::pair<int64_t, int64_t> Range(int64_t units, bool per_key_head) const;
  // The same within one key head's `units` rows: all of them, or this rank's part.
  std::pair<int64_t, int64_t> InHead(int64_t units, bool per_key_head) const;
};

// Rank `rank` of a tp group of `size` ranks: total_heads / size consecutive key heads, or, when `size` is
// a multiple of total_heads, size / total_heads ranks to each key head, each with an equal part of its
// `value_heads_per_key_head` value heads. kda::Error when neither divides.
HeadShard MakeHeadShard(int total_heads, int rank, int size, int value_heads_per_key_head = 1);

// One layer's weights by table name, Hugging Face layouts (Linear [out, in]),
// fp32 values. A `kda quantize` checkpoint's projections are in `q8` instead.
struct LayerWeights {
  std::map<std::string, std::vector<float>> dense;
  std::map<std::string, Q8Weight> q8;

  bool Has(const std::string& name) const { return dense.count(name) != 0 || q8.count(name) != 0; }
  // kda::Error naming the tensor when absent.
  const std::vector<float>& Dense(const std::string& name) const;
};

// A run of elements [begin, end) (flat, row-major) read from checkpoint tensor `name`.
struct TensorRead {
  std::string name;
  int64_t begin = 0;
  int64_t end = 0;
};

// Reads every tensor of `table` (the full layer's) named `prefix` + spec.name
// from the checkpoint, only `shard`'s part (every tensor's full shape is still
// checked; a group's tensors, see TensorSpec::group, as their concatenation),
// into the layout of the shard's table. Checks presence, dtype
// (F32 or BF16; I8 + F16 scales for the quantizable tensors of a `kda
// quantize` checkpoint), shape and that every value read is finite (a NaN or
// infinity is a kda::Error naming the key and element); a tensor under
// `prefix` that the table does not name is a kda::Error naming it. `reads`
// (optional) receives each run of elements read.
LayerWeights LoadLayerWeights(const Checkpoint& ckpt, const std::string& prefix, const TensorTable& table,
                              const HeadShard& shard, std::vector<TensorRead>* reads = nullptr);

// Deterministic random weights (each tensor as its TensorInit says, in table order).
LayerWeights RandomLayerWeights(const TensorTable& table, uint64_t seed);

// The shard's part of full weights (`table`: the full layer's), as LoadLayerWeights cuts it.
LayerWeights ShardLayerWeights(const LayerWeights& w, const TensorTable& table, const HeadShard& shard);

// The weights with every quantizable tensor replaced by its Q8 round trip,
// DequantizeQ8(QuantizeQ8(w)) (exact fp32 values; Q8 tensors dequantized):
// what an int8 layer multiplies by (rounded to bf16 in the bf16 pipeline).
// kda::Error as QuantizeQ8.
LayerWeights DequantizeLayerWeights(const LayerWeights& w, const TensorTable& table);

}  // namespace kda
