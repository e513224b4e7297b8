#include "kda/models/delta_rule_layer.h"

#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/act_buffer.h"
#include "base/scratch.h"
#include "kda/base/bf16.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/distributed/communicator.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/short_conv.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"

namespace kda {

struct DeltaRuleLayer::Projected {
  ActBuffer mixed_qkv;    // [T, C] the conv inputs q|k|v
  ActBuffer gate_raw;     // [T, gate_width] before dt_bias
  ActBuffer beta_logits;  // [T, HV]
  ActBuffer output_gate;  // [T, HV * V] the gated norm's gate input
  ActBuffer scratch[2];   // the low-rank projections' intermediates
};

namespace {

// kda::Error naming the tensor unless `w` holds every tensor of `table` with its size (a Q8 tensor: its rows and
// cols), and nothing else. `who` starts the message.
void CheckWeights(const LayerWeights& w, const TensorTable& table, const std::string& who) {
  for (const TensorSpec& t : table) {
    if (const auto q = w.q8.find(t.name); q != w.q8.end()) {
      Check(t.quantizable && q->second.rows == t.rows() && q->second.cols == t.cols, [&] {
        return who + ": int8 weight " + t.name + " has shape [" + std::to_string(q->second.rows) + ", " +
               std::to_string(q->second.cols) + "], expected [" + std::to_string(t.rows()) + ", " +
               std::to_string(t.cols) + "]";
      });
      continue;
    }
    const auto d = w.dense.find(t.name);
    Check(d != w.dense.end(), who + ": weight " + t.name + " is missing");
    Check(static_cast<int64_t>(d->second.size()) == t.numel(), [&] {
      return who + ": weight " + t.name + " has " + std::to_string(d->second.size()) + " values, expected " +
             std::to_string(t.numel());
    });
  }
  Check(w.dense.size() + w.q8.size() == table.size(), who + ": weights hold tensors the layer does not have");
}

// The name of the table's tensor of `role` (A_log, dt_bias, the norm, the output projection).
const TensorSpec& TensorOf(const TensorTable& table, TensorRole role, const std::string& who) {
  for (const TensorSpec& t : table) {
    if (!t.parts.empty() && t.parts.front().role == role) return t;
  }
  throw Error(who + ": the tensor table has no tensor for one of the layer's parameters");
}

}  // namespace

std::vector<DeltaRuleLayer::RowBlock> DeltaRuleLayer::RoleRows(const TensorTable& table, TensorRole role,
                                                               bool projections, int key_heads, int64_t* cols,
                                                               bool conv_bias) {
  std::vector<RowBlock> blocks;
  *cols = 0;
  for (const TensorSpec& t : table) {
    if (t.quantizable != projections || t.shard == ShardAxis::kCols || t.conv_bias != conv_bias) continue;
    const size_t first = blocks.size();
    if (t.shard == ShardAxis::kNone) {
      if (t.parts.front().role == role) blocks.push_back({t.name, 0, t.rows()});
    } else if (t.interleaved) {
      int64_t group = 0;
      for (const TensorPart& p : t.parts) group += p.units;
      for (int64_t h = 0; h < key_heads; ++h) {
        int64_t offset = h * group;
        for (const TensorPart& p : t.parts) {
          if (p.role == role) blocks.push_back({t.name, offset, offset + p.units});
          offset += p.units;
        }
      }
    } else {
      int64_t base = 0;
      for (const TensorPart& p : t.parts) {
        if (p.role == role) blocks.push_back({t.name, base, base + key_heads * p.units});
        base += key_heads * p.units;
      }
    }
    if (blocks.size() == first) continue;
    Check(*cols == 0 || *cols == t.cols, "tensor table: the rows of one role have different column counts");
    *cols = t.cols;
  }
  return blocks;
}

DeltaRuleLayer::Projection DeltaRuleLayer::AddRole(const LayerWeights& w, const TensorTable& table,
                                                   const DeltaRuleGeometry& g, const std::vector<TensorRole>& roles,
                                                   std::optional<TensorRole> down, int64_t rows,
                                                   const std::string& what, const std::string& who) {
  std::vector<RowBlock> blocks;
  int64_t cols = 0;
  for (TensorRole r : roles) {
    int64_t c = 0;
    const std::vector<RowBlock> b = RoleRows(table, r, /*projections=*/true, g.H, &c);
    Check(!b.empty(), who + ": the tensor table has no rows for the " + what);
    Check(cols == 0 || c == cols, who + ": the " + what + " rows have different column counts");
    cols = c;
    blocks.insert(blocks.end(), b.begin(), b.end());
  }
  std::string names;  // "q_proj|k_proj|v_proj", for messages
  int64_t total = 0;
  for (const RowBlock& b : blocks) {
    const std::string name = b.name.substr(0, b.name.rfind(".weight"));
    if (("|" + names + "|").find("|" + name + "|") == std::string::npos) names += (names.empty() ? "" : "|") + name;
    total += b.r1 - b.r0;
  }
  Check(total == rows, [&] {
    return who + ": the " + what + " has " + std::to_string(total) + " rows in the tensor table, the geometry " +
           std::to_string(rows) + " (a decay per " +
           (g.decay == DecayWidth::kPerKeyDim ? "key dimension" : "value head") + ")";
  });
  Projection p;
  int64_t down_cols = 0;
  const std::vector<RowBlock> first =
      down ? RoleRows(table, *down, /*projections=*/true, g.H, &down_cols) : std::vector<RowBlock>{};
  if (first.empty()) {
    Check(cols == g.hidden, who + ": the " + what + " must read the hidden states");
    p.first = &AddProjection(w, blocks, cols, names);
    return p;
  }
  Check(down_cols == g.hidden, who + ": a low-rank projection's first half must read the hidden states");
  p.first = &AddProjection(w, first, g.hidden, first.front().name);
  p.second = &AddProjection(w, blocks, cols, names);
  Check(p.first->out_features() == cols, who + ": a low-rank projection's halves do not chain");
  return p;
}

DeltaRuleLayer::DeltaRuleLayer(const std::string& who, const TensorTable& table, int layer_id,
                               const DeltaRuleGeometry& g, const LayerWeights& w, DType act_dtype, Communicator* tp,
                               WeightFormat weights_format)
    : act_dtype_(act_dtype), weights_format_(weights_format), tp_(tp) {
  Check(act_dtype == DType::kF32 || act_dtype == DType::kBF16, who + ": dtype must be F32 or BF16");
  g.Validate(who);
  Check(g.head_split == 1 || (tp != nullptr && tp->size() % g.head_split == 0),
        who + ": a shard of a key head's value heads needs the tp ranks that share it");
  Check(g.decay == DecayWidth::kPerValueHead || (g.K % 16 == 0 && g.K >= 16),
        who + ": a KDA layer's head dim must be a multiple of 16 in [16, 256], got " + std::to_string(g.K));
  CheckWeights(w, table, who);
  const int64_t hid = g.hidden;
  // The input projections by role: q|k|v in one GEMM (the conv's channels in order: Mamba2's x|B|C), the raw
  // gate, beta (none in a Mamba2 mixer: beta is its dt) and the output gate, each with its low-rank first half
  // where the table has one.
  using R = TensorRole;
  const std::vector<R> channels = g.ssd ? std::vector<R>{R::kV, R::kK, R::kQ} : std::vector<R>{R::kQ, R::kK, R::kV};
  qkv_proj_ =
      AddRole(w, table, g, channels, std::nullopt, g.conv_channels(), g.ssd ? "x|B|C" : "q|k|v projection", who);
  gate_proj_ = AddRole(w, table, g, {R::kGate}, R::kGateDown, g.gate_width(), "gate projection", who);
  if (!g.ssd) beta_proj_ = AddRole(w, table, g, {R::kBeta}, std::nullopt, g.HV, "beta projection", who);
  out_gate_proj_ = AddRole(w, table, g, {R::kOutGate}, R::kOutGateDown, g.value_dim(), "output gate projection", who);
  if (g.ssd && g.ssd_scaled()) {  // in_proj's parts z | x | B | C | dt scaled by their multipliers
    const std::array<float, 5>& m = g.ssd_multipliers;
    out_gate_proj_.scale.assign(static_cast<size_t>(g.value_dim()), m[0]);
    qkv_proj_.scale.assign(static_cast<size_t>(g.value_dim()), m[1]);
    qkv_proj_.scale.resize(static_cast<size_t>(g.value_dim() + g.key_dim()), m[2]);
    qkv_proj_.scale.resize(static_cast<size_t>(g.conv_channels()), m[3]);
    gate_proj_.scale.assign(static_cast<size_t>(g.HV), m[4]);
  }

  // The convs in the backend's layout from the checkpoint's [C_g, W] rows of each channel group in channel
  // order (rounded to bf16 in the bf16 pipeline unless the geometry keeps them fp32), and a Mamba2 mixer's bias.
  std::vector<float> conv;
  std::vector<float> bias;
  conv.reserve(static_cast<size_t>(g.conv_channels() * g.W));
  for (R role : channels) {
    const int64_t width = role == R::kV ? g.value_dim() : g.key_dim();
    int64_t cols = 0;
    std::vector<float> rows;
    for (const RowBlock& b : RoleRows(table, role, /*projections=*/false, g.H, &cols)) {
      const std::vector<float>& m = w.Dense(b.name);
      rows.insert(rows.end(), m.begin() + b.r0 * cols, m.begin() + b.r1 * cols);
    }
    Check(cols == g.W && static_cast<int64_t>(rows.size()) == width * g.W,
          who + ": the tensor table's conv rows do not fit the geometry");
    const std::vector<float> t = ShortConvWeightFromCheckpoint(rows, width, g.W);
    conv.insert(conv.end(), t.begin(), t.end());
    if (!g.ssd) continue;
    const size_t at = bias.size();
    for (const RowBlock& b : RoleRows(table, role, /*projections=*/false, g.H, &cols, /*conv_bias=*/true)) {
      const std::vector<float>& m = w.Dense(b.name);
      bias.insert(bias.end(), m.begin() + b.r0, m.begin() + b.r1);
    }
    Check(static_cast<int64_t>(bias.size() - at) == width, who + ": the tensor table's conv bias does not fit");
  }
  if (act_dtype_ == DType::kBF16 && !g.conv_weights_f32) {
    for (float& x : conv) x = RoundBF16(x);
    for (float& x : bias) x = RoundBF16(x);
  }
  // A_log, dt_bias and D stay fp32 parameters (design §1); a Mamba2 mixer reads C unscaled.
  attn_ = std::make_unique<RadixLinearAttention>(
      layer_id, g, std::move(conv), w.Dense(TensorOf(table, TensorRole::kALog, who).name),
      w.Dense(TensorOf(table, TensorRole::kDtBias, who).name), g.ssd ? 1.0F : 1.0F / std::sqrt(static_cast<float>(g.K)),
      std::move(bias), g.ssd ? w.Dense(TensorOf(table, TensorRole::kD, who).name) : std::vector<float>{});
  if (g.ssd_norm != SsdNorm::kGateOnly) {
    norm_weight_ = w.Dense(TensorOf(table, TensorRole::kNorm, who).name);
    Check(static_cast<int64_t>(norm_weight_.size()) == (g.ssd ? g.value_dim() : g.V),
          who + (g.ssd ? ": the norm weight must be [HV * V]" : ": the norm weight must be [V]"));
  }
  if (act_dtype_ == DType::kBF16) {
    for (float& x : norm_weight_) x = RoundBF16(x);
  }
  // The output projection [hidden, HV*V] is built like the others, then set apart.
  const std::string& out_name = TensorOf(table, TensorRole::kOut, who).name;
  AddProjection(w, {{out_name, 0, hid}}, g.value_dim(), out_name);
  out_proj_ = std::move(projections_.back());
  projections_.pop_back();
}

DeltaRuleLayer::~DeltaRuleLayer() = default;

const Linear& DeltaRuleLayer::AddProjection(const LayerWeights& w, const std::vector<RowBlock>& blocks, int64_t cols,
                                            const std::string& what) {
  Check(!blocks.empty(), "delta-rule layer: projection " + what + " has no rows");
  const bool q8 = w.q8.count(blocks.front().name) != 0;
  for (const RowBlock& b : blocks) {
    Check(w.q8.count(b.name) != 0 || w.dense.count(b.name) != 0, "delta-rule layer: missing weight " + b.name);
    Check((w.q8.count(b.name) != 0) == q8, "delta-rule layer: projection " + what + " mixes int8 and dense weights");
  }
  if (q8) {
    Check(weights_format_ == WeightFormat::kInt8,
          "the weights are int8 (a kda quantize checkpoint): load them with --weights int8 (WeightFormat::kInt8)");
    std::vector<Q8Weight> parts;
    for (const RowBlock& b : blocks) {
      const Q8Weight& m = w.q8.at(b.name);
      Check(m.cols == cols && b.r0 >= 0 && b.r0 <= b.r1 && b.r1 <= m.rows, [&] {
        return "delta-rule layer: int8 weight " + b.name + " has shape [" + std::to_string(m.rows) + ", " +
               std::to_string(m.cols) + "], expected " + std::to_string(cols) + " columns and at least " +
               std::to_string(b.r1) + " rows";
      });
      parts.push_back(b.r0 == 0 && b.r1 == m.rows ? m : SliceQ8(m, b.r0, b.r1, 0, cols));
    }
    std::vector<const Q8Weight*> ptrs;
    ptrs.reserve(parts.size());
    for (const Q8Weight& p : parts) ptrs.push_back(&p);
    projections_.push_back(
        std::make_unique<Linear>(parts.size() == 1 ? std::move(parts.front()) : ConcatQ8Rows(ptrs), act_dtype_));
    return *projections_.back();
  }
  std::vector<float> rows;
  for (const RowBlock& b : blocks) {
    const std::vector<float>& m = w.Dense(b.name);
    Check(b.r0 >= 0 && b.r0 <= b.r1 && b.r1 * cols <= static_cast<int64_t>(m.size()) &&
              static_cast<int64_t>(m.size()) % cols == 0,
          [&] {
            return "delta-rule layer: weight " + b.name + " has " + std::to_string(m.size()) + " values, expected [" +
                   std::to_string(b.r1) + "+, " + std::to_string(cols) + "]";
          });
    rows.insert(rows.end(), m.begin() + b.r0 * cols, m.begin() + b.r1 * cols);
  }
  const int64_t out = static_cast<int64_t>(rows.size()) / cols;
  if (weights_format_ == WeightFormat::kInt8) {
    projections_.push_back(std::make_unique<Linear>(QuantizeQ8(rows, out, cols, what), act_dtype_));
  } else {
    projections_.push_back(std::make_unique<Linear>(rows, out, cols, act_dtype_));
  }
  return *projections_.back();
}

int64_t DeltaRuleLayer::projection_weight_bytes() const {
  int64_t n = out_proj_->weight_bytes();
  for (const auto& l : projections_) n += l->weight_bytes();
  return n;
}

void DeltaRuleLayer::CheckInputDtype(ConstBuf x) const {
  Check(x.dtype == act_dtype_, std::string("hidden_states dtype ") + DTypeName(x.dtype) +
                                   " does not match the layer dtype " + DTypeName(act_dtype_));
}

void DeltaRuleLayer::Project(ConstBuf x, int64_t T, Projected& r) const {
  // fp32 accumulation, rounded once in the bf16 pipeline (a low-rank pair: after each half); a scaled
  // projection's factors applied before that rounding.
  const auto run = [&](const Projection& p, ActBuffer& scratch, ActBuffer& out) {
    const Linear& last = p.second != nullptr ? *p.second : *p.first;
    const int64_t n = last.out_features();
    out = ActBuffer::Uninitialized(act_dtype_, T * n);
    ConstBuf in = x;
    if (p.second != nullptr) {
      scratch = ActBuffer::Uninitialized(act_dtype_, T * p.first->out_features());
      p.first->Forward(scratch.mut(), x, T);
      in = scratch.view();
    }
    if (p.scale.empty()) {
      last.Forward(out.mut(), in, T);
      return;
    }
    ScratchArray<float> acc(static_cast<size_t>(T * n));
    last.Forward({acc.data(), DType::kF32}, in, T);
    // Each token's row scaled and rounded once, in typed loops over the tokens in parallel.
    const float* sc = p.scale.data();
    ParallelFor(T, [&](int64_t t) {
      const float* a = acc.data() + t * n;
      if (act_dtype_ == DType::kF32) {
        float* y = static_cast<float*>(out.mut().data) + t * n;
        for (int64_t j = 0; j < n; ++j) y[j] = a[j] * sc[j];
      } else {
        BF16* y = static_cast<BF16*>(out.mut().data) + t * n;
        for (int64_t j = 0; j < n; ++j) y[j] = ToBF16(a[j] * sc[j]);
      }
    });
  };
  run(qkv_proj_, r.scratch[0], r.mixed_qkv);
  run(gate_proj_, r.scratch[0], r.gate_raw);
  if (beta_proj_.first != nullptr) run(beta_proj_, r.scratch[0], r.beta_logits);
  run(out_gate_proj_, r.scratch[1], r.output_gate);
}

void DeltaRuleLayer::ForwardProjections(ConstBuf x, int64_t T) const {
  CheckInputDtype(x);
  Check(T >= 0 && (T == 0 || x.data != nullptr), "delta-rule layer: null input or negative token count");
  if (T == 0) return;
  Projected pr;
  Project(x, T, pr);
  ActBuffer out = ActBuffer::Uninitialized(act_dtype_, T * geometry().hidden);
  out_proj_->Forward(out.mut(), pr.output_gate.view(), T);
}

void DeltaRuleLayer::Forward(MutBuf out, ConstBuf x, LinearRecurrentAttnBackend& backend) const {
  CheckInputDtype(x);
  Check(out.dtype == act_dtype_, "delta-rule layer: output dtype does not match the layer dtype");
  const int64_t T = backend.metadata().num_tokens;
  Check(T == 0 || (x.data != nullptr && out.data != nullptr), "delta-rule layer: null input or output");
  if (T == 0) {
    // IDLE or an all-empty batch still runs the backend (it leaves no state
    // behind for empty sequences but keeps their tails and states as they are).
    backend.Forward(*attn_, out, x, x, x);
    return;
  }
  const DeltaRuleGeometry& geo = geometry();
  const DType dt = act_dtype_;
  const int layer_id = attn_->layer_id();
  LayerObserver* obs = backend.observer();
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kInput, x, T * geo.hidden);

  Projected pr;
  Project(x, T, pr);

  // The attention core: conv, gates, kernel, states.
  ActBuffer o = ActBuffer::Uninitialized(dt, T * geo.value_dim());
  // A Mamba2 mixer has no beta logits (beta is its dt): the raw gate stands in for them.
  const ConstBuf beta_logits = beta_proj_.first != nullptr ? pr.beta_logits.view() : pr.gate_raw.view();
  backend.Forward(*attn_, o.mut(), pr.mixed_qkv.view(), pr.gate_raw.view(), beta_logits);
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kOutputGate, pr.output_gate.view(), pr.output_gate.size());

  // Gated RMSNorm per token and value head over V (a Mamba2 mixer: the gate first, over the r heads of a
  // group), then the output projection.
  ActBuffer normed = ActBuffer::Uninitialized(dt, T * geo.value_dim());
  if (geo.ssd && geo.head_split > 1 && geo.ssd_norm != SsdNorm::kGateOnly) {
    // The group's heads split over head_split consecutive tp ranks (this rank: one group's part): the sums
    // of squares of every group's parts added across the ranks, [T, groups], this rank's group a column.
    const int64_t width = int64_t{geo.group()} * geo.V;
    const int groups = tp_->size() / geo.head_split;
    const int mine = tp_->rank() / geo.head_split;
    std::vector<float> part(static_cast<size_t>(T));
    GatedRmsNormGroupsSquares(part.data(), o.view(), pr.output_gate.view(), T, 1, width, geo.ssd_norm);
    std::vector<float> sums(static_cast<size_t>(T * groups), 0.0F);
    for (int64_t t = 0; t < T; ++t) sums[static_cast<size_t>(t * groups + mine)] = part[static_cast<size_t>(t)];
    tp_->AllReduceSum(sums.data(), static_cast<int64_t>(sums.size()));
    for (int64_t t = 0; t < T; ++t) part[static_cast<size_t>(t)] = sums[static_cast<size_t>(t * groups + mine)];
    GatedRmsNormGroupsFromSquares(normed.mut(), o.view(), pr.output_gate.view(), norm_weight_.data(), part.data(),
                                  width * geo.head_split, T, 1, width, static_cast<float>(geo.rms_norm_eps),
                                  geo.ssd_norm);
  } else if (geo.ssd) {
    GatedRmsNormGroups(normed.mut(), o.view(), pr.output_gate.view(), norm_weight_.data(), T, geo.H,
                       int64_t{geo.group()} * geo.V, static_cast<float>(geo.rms_norm_eps), geo.ssd_norm);
  } else {
    GatedRmsNorm(normed.mut(), o.view(), pr.output_gate.view(), norm_weight_.data(), T, geo.HV, geo.V,
                 static_cast<float>(geo.rms_norm_eps), geo.output_gate);
  }
  if (tp_ == nullptr || tp_->size() == 1) {
    out_proj_->Forward(out, normed.view(), T);
  } else {
    // Tensor parallel: fp32 partial sums over this rank's heads, summed across
    // ranks, then the one cast point of the bf16 pipeline.
    std::vector<float> partial(static_cast<size_t>(T * geo.hidden));
    out_proj_->Forward({partial.data(), DType::kF32}, normed.view(), T);
    tp_->AllReduceSum(partial.data(), static_cast<int64_t>(partial.size()));
    for (size_t i = 0; i < partial.size(); ++i) StoreFromFloat(out.data, out.dtype, i, partial[i]);
  }
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kOutput, {out.data, out.dtype}, T * geo.hidden);
}

std::unique_ptr<DeltaRuleLayer> LayerFamily::MakeLayer(int layer_id, const DeltaRuleGeometry& geometry,
                                                       const LayerWeights& weights, DType act_dtype, Communicator* tp,
                                                       WeightFormat weights_format) const {
  Check(geometry.decay == reference.decay && geometry.ssd == reference.ssd,
        layer_class + ": the geometry must be a " +
            (reference.ssd                               ? "Mamba2 mixer's (DeltaRuleGeometry::Mamba2)"
             : reference.decay == DecayWidth::kPerKeyDim ? "KDA one (a decay per key dimension)"
                                                         : "Gated DeltaNet one (a decay per value head)"));
  return std::make_unique<DeltaRuleLayer>(layer_class, tensors(geometry), layer_id, geometry, weights, act_dtype, tp,
                                          weights_format);
}

}  // namespace kda
