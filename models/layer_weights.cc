#include "kda/models/layer_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/safetensors.h"

namespace kda {
namespace {

// Checks that tensor `name` exists, is F32 or BF16 and has one of `shapes`.
const TensorInfo& CheckedTensor(const Checkpoint& ckpt, const std::string& name,
                                const std::vector<std::vector<int64_t>>& shapes) {
  Check(ckpt.Has(name), "checkpoint is missing tensor " + name);
  const TensorInfo& t = ckpt.Get(name);
  Check(t.dtype == DType::kF32 || t.dtype == DType::kBF16,
        "tensor " + name + " has dtype " + DTypeName(t.dtype) + ", expected BF16 or F32");
  bool ok = false;
  for (const auto& s : shapes) ok = ok || s == t.shape;
  Check(ok, "tensor " + name + " has shape " + ShapeString(t.shape) + ", expected " + ShapeString(shapes.front()));
  Check(static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype) == t.nbytes && (t.nbytes == 0 || t.data != nullptr),
        "tensor " + name + ": its data does not match its shape");
  return t;
}

// Logs the run [begin, end) of tensor `name`, merged with the previous run when contiguous.
void LogRead(std::vector<TensorRead>* reads, const std::string& name, int64_t begin, int64_t end) {
  if (reads == nullptr || begin == end) return;
  if (!reads->empty() && reads->back().name == name && reads->back().end == begin) {
    reads->back().end = end;
  } else {
    reads->push_back({name, begin, end});
  }
}

// Reads rows [r0, r1) x columns [c0, c1) of tensor `name` (one of `shapes`)
// viewed as a row-major [numel / cols, cols] matrix, converting only those
// elements from the mapped file. A NaN or infinity read is a kda::Error
// naming the tensor and the element: weights are checked once here, so the
// layers' hot paths need not.
std::vector<float> ReadBlock(const Checkpoint& ckpt, const std::string& name,
                             const std::vector<std::vector<int64_t>>& shapes, int64_t cols, int64_t r0, int64_t r1,
                             int64_t c0, int64_t c1, std::vector<TensorRead>* reads) {
  const TensorInfo& t = CheckedTensor(ckpt, name, shapes);
  const int64_t rows = t.numel() / cols;
  Check(rows * cols == t.numel() && r0 >= 0 && r0 <= r1 && r1 <= rows && c0 >= 0 && c0 <= c1 && c1 <= cols,
        "tensor " + name + ": block out of range");
  const size_t esize = DTypeSize(t.dtype);
  std::vector<float> out;
  out.reserve(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t begin = r * cols + c0;
    const int64_t end = r * cols + c1;
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* p = t.data + static_cast<size_t>(i) * esize;  // memcpy: data may be unaligned
      if (t.dtype == DType::kF32) {
        float v = 0.0F;
        std::memcpy(&v, p, sizeof(v));
        out.push_back(v);
      } else {
        BF16 v;
        std::memcpy(&v.bits, p, sizeof(v.bits));
        out.push_back(ToFloat(v));
      }
      if (!std::isfinite(out.back())) {
        const char* kind = std::isnan(out.back()) ? "nan" : (out.back() > 0 ? "+inf" : "-inf");
        throw Error("checkpoint tensor " + name + " has a non-finite value (" + kind + ") at element " +
                    ElementIndexString(t.shape, i));
      }
    }
    LogRead(reads, name, begin, end);
  }
  return out;
}

// Rows [r0, r1) x columns [c0, c1) of the Q8 projection `name` ([rows, cols]
// I8 values `name`, F16 scales `name`_scale [rows, cols / 32]); c0 and c1
// multiples of 32. The values read are checked (CheckQ8Weight).
Q8Weight ReadQ8Block(const Checkpoint& ckpt, const std::string& wname, int64_t rows, int64_t cols, int64_t r0,
                     int64_t r1, int64_t c0, int64_t c1, std::vector<TensorRead>* reads) {
  const std::string sname = wname + "_scale";
  Check(cols % kQ8Block == 0 && c0 % kQ8Block == 0 && c1 % kQ8Block == 0,
        "int8 checkpoint: " + wname + " has input dim " + std::to_string(cols) + ", not a multiple of 32");
  Check(ckpt.Has(sname), "int8 checkpoint is missing tensor " + sname);
  const TensorInfo& tq = ckpt.Get(wname);
  const TensorInfo& ts = ckpt.Get(sname);
  Check(tq.dtype == DType::kI8, "tensor " + wname + " has dtype " + DTypeName(tq.dtype) + ", expected I8");
  Check(ts.dtype == DType::kF16, "tensor " + sname + " has dtype " + DTypeName(ts.dtype) + ", expected F16");
  const int64_t nb = cols / kQ8Block;
  Check(tq.shape == std::vector<int64_t>{rows, cols},
        "tensor " + wname + " has shape " + ShapeString(tq.shape) + ", expected " + ShapeString({rows, cols}));
  Check(ts.shape == std::vector<int64_t>{rows, nb},
        "tensor " + sname + " has shape " + ShapeString(ts.shape) + ", expected " + ShapeString({rows, nb}));
  Check(tq.nbytes == static_cast<size_t>(rows * cols) && ts.nbytes == static_cast<size_t>(rows * nb) * 2 &&
            tq.data != nullptr && ts.data != nullptr,
        "tensor " + wname + ": its data does not match its shape");
  Q8Weight w;
  w.rows = r1 - r0;
  w.cols = c1 - c0;
  w.q.resize(static_cast<size_t>(w.rows * w.cols));
  w.scales.resize(static_cast<size_t>(w.rows * (w.cols / kQ8Block)));
  for (int64_t r = r0; r < r1; ++r) {
    std::memcpy(w.q.data() + (r - r0) * w.cols, tq.data + r * cols + c0, static_cast<size_t>(c1 - c0));
    std::memcpy(w.scales.data() + (r - r0) * (w.cols / kQ8Block), ts.data + (r * nb + c0 / kQ8Block) * 2,
                static_cast<size_t>((c1 - c0) / kQ8Block) * 2);
    LogRead(reads, wname, r * cols + c0, r * cols + c1);
    LogRead(reads, sname, r * nb + c0 / kQ8Block, r * nb + c1 / kQ8Block);
  }
  CheckQ8Weight(w, "checkpoint tensor " + wname);
  return w;
}

// Whether a part holds a key head's own rows (q and k, Mamba2's B and C: whole on each rank sharing the key
// head) rather than its value heads' (split among them).
bool PerKeyHead(const TensorPart& p) { return p.role == TensorRole::kQ || p.role == TensorRole::kK; }

// The index ranges [begin, end) of the shard's part of a cut axis, one per part (an interleaved tensor: one
// per key head and part).
std::vector<std::pair<int64_t, int64_t>> ShardRanges(const TensorSpec& spec, const HeadShard& shard) {
  std::vector<std::pair<int64_t, int64_t>> r;
  int64_t base = 0;
  if (spec.interleaved) {
    int64_t group = 0;  // a key head's rows of every part, in turn
    for (const TensorPart& p : spec.parts) group += p.units;
    for (int h = shard.begin; h < shard.begin + shard.count; ++h) {
      int64_t offset = int64_t{h} * group;
      for (const TensorPart& p : spec.parts) {
        const auto [b, e] = shard.InHead(p.units, PerKeyHead(p));
        if (!r.empty() && r.back().second == offset + b) {
          r.back().second = offset + e;  // contiguous with the last run
        } else {
          r.emplace_back(offset + b, offset + e);
        }
        offset += p.units;
      }
    }
    base = int64_t{shard.total} * group;
  } else {
    for (const TensorPart& p : spec.parts) {
      const auto [b, e] = shard.Range(p.units, PerKeyHead(p));
      r.emplace_back(base + b, base + e);
      base += int64_t{shard.total} * p.units;
    }
  }
  const int64_t axis = spec.shard == ShardAxis::kRows ? spec.rows() : spec.cols;
  Check(base == axis, "tensor table: " + spec.name + "'s parts do not cover its cut axis");
  Check(spec.shard != ShardAxis::kCols || r.size() == 1,
        "tensor table: " + spec.name + " is cut along its columns in more than one part");
  return r;
}

// Rows [r0, r1) x columns [c0, c1) of a row-major [rows, cols] matrix.
std::vector<float> CutBlock(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    out.insert(out.end(), m.begin() + r * cols + c0, m.begin() + r * cols + c1);
  }
  return out;
}

// A group's tensors as the checkpoint stores them (TensorSpec::group): their keys and row counts, and
// whether each has its table shape (then each is read as itself).
struct StoredGroup {
  std::vector<std::string> keys;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> rows;
  bool as_table = true;
};

// The stored split of the group of `spec` (the table's tensors of its group, in table order): every part
// present, F32 or BF16, with a table shape's trailing dims, and the table's rows in all.
StoredGroup ReadGroup(const Checkpoint& ckpt, const std::string& prefix, const TensorTable& table,
                      const TensorSpec& spec) {
  StoredGroup g;
  int64_t want = 0;
  int64_t have = 0;
  std::string names;
  for (const TensorSpec& t : table) {
    if (t.group != spec.group) continue;
    const std::string key = prefix + t.name;
    Check(ckpt.Has(key), "checkpoint is missing tensor " + key);
    const TensorInfo& info = ckpt.Get(key);
    Check(info.dtype == DType::kF32 || info.dtype == DType::kBF16,
          "tensor " + key + " has dtype " + DTypeName(info.dtype) + ", expected BF16 or F32");
    bool table_shape = false;
    bool split_shape = false;
    for (const auto& s : t.shapes) {
      table_shape = table_shape || s == info.shape;
      split_shape = split_shape || (s.size() == info.shape.size() && !s.empty() && info.shape[0] > 0 &&
                                    std::equal(s.begin() + 1, s.end(), info.shape.begin() + 1));
    }
    Check(split_shape, "tensor " + key + " has shape " + ShapeString(info.shape) + ", expected " +
                           ShapeString(t.shapes.front()) + " (or rows of " + spec.group + " split elsewhere)");
    g.as_table = g.as_table && table_shape;
    g.keys.push_back(key);
    g.shapes.push_back(info.shape);
    g.rows.push_back(info.shape[0]);
    want += t.shapes.front()[0];
    have += info.shape[0];
    names += (names.empty() ? "" : ", ") + t.name;
  }
  Check(have == want, "tensors " + names + " under " + prefix + " have " + std::to_string(have) +
                          " rows in all, expected " + std::to_string(want) + " (the rows of " + spec.group + ")");
  return g;
}

// Rows [r0, r1) of a group's concatenation (rows of `cols` values), read from its stored parts.
std::vector<float> ReadGroupRows(const Checkpoint& ckpt, const StoredGroup& g, int64_t cols, int64_t r0, int64_t r1,
                                 std::vector<TensorRead>* reads) {
  std::vector<float> out;
  int64_t base = 0;
  for (size_t i = 0; i < g.keys.size(); ++i) {
    const int64_t a = std::max(r0, base);
    const int64_t b = std::min(r1, base + g.rows[i]);
    if (a < b) {
      const std::vector<float> block =
          ReadBlock(ckpt, g.keys[i], {g.shapes[i]}, cols, a - base, b - base, 0, cols, reads);
      out.insert(out.end(), block.begin(), block.end());
    }
    base += g.rows[i];
  }
  return out;
}

// The rows before `spec`'s in its group's concatenation (the table's earlier tensors of the group).
int64_t GroupOffset(const TensorTable& table, const TensorSpec& spec) {
  int64_t offset = 0;
  for (const TensorSpec& t : table) {
    if (&t == &spec) break;
    if (t.group == spec.group) offset += t.shapes.front()[0];
  }
  return offset;
}

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shapes.front()) n *= d;
  return n;
}

HeadShard MakeHeadShard(int total_heads, int rank, int size, int value_heads_per_key_head) {
  Check(size >= 1 && rank >= 0 && rank < size,
        "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");
  HeadShard s;
  s.total = total_heads;
  if (total_heads % size == 0) {
    s.count = total_heads / size;
    s.begin = rank * s.count;
    return s;
  }
  const int split = size / std::max(total_heads, 1);
  Check(total_heads >= 1 && size % total_heads == 0 && value_heads_per_key_head % split == 0, [&] {
    return "the model's " + std::to_string(total_heads) + " heads cannot be split evenly over --tp " +
           std::to_string(size) + " ranks (--tp must divide the number of heads, or be a multiple of it that divides" +
           " the " + std::to_string(value_heads_per_key_head) + " value heads of each)";
  });
  s.count = 1;
  s.split = split;
  s.begin = rank / split;
  s.part = rank % split;
  return s;
}

std::pair<int64_t, int64_t> HeadShard::InHead(int64_t units, bool per_key_head) const {
  if (per_key_head || split == 1) return {0, units};
  Check(units % split == 0, "tensor table: a part of " + std::to_string(units) +
                                " rows per key head cannot be split over " + std::to_string(split) + " ranks");
  const int64_t n = units / split;
  return {part * n, (part + 1) * n};
}

std::pair<int64_t, int64_t> HeadShard::Range(int64_t units, bool per_key_head) const {
  const int64_t first = int64_t{begin} * units;
  if (split == 1) return {first, first + int64_t{count} * units};
  const auto [b, e] = InHead(units, per_key_head);  // count is 1
  return {first + b, first + e};
}

const std::vector<float>& LayerWeights::Dense(const std::string& name) const {
  const auto it = dense.find(name);
  Check(it != dense.end(), "layer weights: missing tensor " + name);
  return it->second;
}

LayerWeights LoadLayerWeights(const Checkpoint& ckpt, const std::string& prefix, const TensorTable& table,
                              const HeadShard& shard, std::vector<TensorRead>* reads) {
  // Every tensor under the prefix must be one the table names (or a Q8 scale of one).
  for (const std::string& key : ckpt.names()) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = key.substr(prefix.size());
    bool known = false;
    for (const TensorSpec& spec : table) {
      known = known || rest == spec.name || (spec.quantizable && rest == spec.name + "_scale");
    }
    Check(known, "checkpoint tensor " + key + " is not a tensor of this layer type (unexpected key)");
  }
  LayerWeights w;
  for (const TensorSpec& spec : table) {
    const std::string key = prefix + spec.name;
    Check(ckpt.Has(key), "checkpoint is missing tensor " + key);
    const int64_t rows = spec.rows();
    const int64_t cols = spec.cols;
    std::vector<std::pair<int64_t, int64_t>> cut;
    if (spec.shard == ShardAxis::kNone || shard.whole()) {
      cut = {{0, rows}};  // whole rows
    } else {
      cut = ShardRanges(spec, shard);
    }
    const bool by_cols = spec.shard == ShardAxis::kCols && !shard.whole();
    if (spec.quantizable && ckpt.Get(key).dtype == DType::kI8) {
      std::vector<Q8Weight> blocks;
      blocks.reserve(cut.size());
      for (const auto& [b, e] : cut) {
        blocks.push_back(by_cols ? ReadQ8Block(ckpt, key, rows, cols, 0, rows, b, e, reads)
                                 : ReadQ8Block(ckpt, key, rows, cols, b, e, 0, cols, reads));
      }
      std::vector<const Q8Weight*> ptrs;
      ptrs.reserve(blocks.size());
      for (const Q8Weight& b : blocks) ptrs.push_back(&b);
      w.q8.emplace(spec.name, blocks.size() == 1 ? std::move(blocks.front()) : ConcatQ8Rows(ptrs));
      continue;
    }
    std::optional<StoredGroup> group;
    if (!spec.group.empty()) {
      Check(spec.shard != ShardAxis::kCols && !spec.quantizable,
            "tensor table: " + spec.name + " is in a group of rows but not cut by rows");
      group = ReadGroup(ckpt, prefix, table, spec);
      if (group->as_table) group.reset();
    }
    std::vector<float> values;
    for (const auto& [b, e] : cut) {
      const int64_t offset = group ? GroupOffset(table, spec) : 0;
      std::vector<float> block = group     ? ReadGroupRows(ckpt, *group, cols, offset + b, offset + e, reads)
                                 : by_cols ? ReadBlock(ckpt, key, spec.shapes, cols, 0, rows, b, e, reads)
                                           : ReadBlock(ckpt, key, spec.shapes, cols, b, e, 0, cols, reads);
      values.insert(values.end(), block.begin(), block.end());
    }
    w.dense.emplace(spec.name, std::move(values));
  }
  return w;
}

LayerWeights RandomLayerWeights(const TensorTable& table, uint64_t seed) {
  std::mt19937_64 rng(seed);
  LayerWeights w;
  for (const TensorSpec& spec : table) {
    std::vector<float> v(static_cast<size_t>(spec.numel()));
    const TensorInit& init = spec.init;
    switch (init.kind) {
      case TensorInit::Kind::kNormal: {
        std::normal_distribution<float> d(0.0F, init.a);
        for (float& x : v) x = RoundBF16(d(rng));
        break;
      }
      case TensorInit::Kind::kUniform: {
        std::uniform_real_distribution<float> d(init.a, init.b);
        for (float& x : v) x = RoundBF16(d(rng));
        break;
      }
      case TensorInit::Kind::kDtBias: {
        std::uniform_real_distribution<float> d(init.a, init.b);
        for (float& x : v) {
          const float dt = std::exp(d(rng));
          x = RoundBF16(dt + std::log(-std::expm1(-dt)));
        }
        break;
      }
    }
    w.dense.emplace(spec.name, std::move(v));
  }
  return w;
}

LayerWeights ShardLayerWeights(const LayerWeights& w, const TensorTable& table, const HeadShard& shard) {
  LayerWeights r;
  for (const TensorSpec& spec : table) {
    if (spec.shard == ShardAxis::kNone || shard.whole()) {
      if (const auto it = w.q8.find(spec.name); it != w.q8.end()) {
        r.q8.emplace(spec.name, it->second);
      } else {
        r.dense.emplace(spec.name, w.Dense(spec.name));
      }
      continue;
    }
    const bool by_cols = spec.shard == ShardAxis::kCols;
    const int64_t rows = spec.rows();
    const int64_t cols = spec.cols;
    const auto cut = ShardRanges(spec, shard);
    if (const auto it = w.q8.find(spec.name); it != w.q8.end()) {
      std::vector<Q8Weight> blocks;
      blocks.reserve(cut.size());
      for (const auto& [b, e] : cut) {
        blocks.push_back(by_cols ? SliceQ8(it->second, 0, rows, b, e) : SliceQ8(it->second, b, e, 0, cols));
      }
      std::vector<const Q8Weight*> ptrs;
      ptrs.reserve(blocks.size());
      for (const Q8Weight& b : blocks) ptrs.push_back(&b);
      r.q8.emplace(spec.name, blocks.size() == 1 ? std::move(blocks.front()) : ConcatQ8Rows(ptrs));
      continue;
    }
    const std::vector<float>& m = w.Dense(spec.name);
    Check(static_cast<int64_t>(m.size()) == spec.numel(), "layer weights: " + spec.name + " has the wrong size");
    std::vector<float> values;
    for (const auto& [b, e] : cut) {
      const std::vector<float> block = by_cols ? CutBlock(m, cols, 0, rows, b, e) : CutBlock(m, cols, b, e, 0, cols);
      values.insert(values.end(), block.begin(), block.end());
    }
    r.dense.emplace(spec.name, std::move(values));
  }
  return r;
}

LayerWeights DequantizeLayerWeights(const LayerWeights& w, const TensorTable& table) {
  LayerWeights r;
  for (const TensorSpec& spec : table) {
    if (const auto it = w.q8.find(spec.name); it != w.q8.end()) {
      r.dense.emplace(spec.name, DequantizeQ8(it->second));
    } else if (spec.quantizable) {
      r.dense.emplace(spec.name, DequantizeQ8(QuantizeQ8(w.Dense(spec.name), spec.rows(), spec.cols, spec.name)));
    } else {
      r.dense.emplace(spec.name, w.Dense(spec.name));
    }
  }
  return r;
}

}  // namespace kda
