#include "kda/models/delta_rule_layer.h"

#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/distributed/communicator.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/short_conv.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/models/layer_weights.h"
#include "models/projected.h"

namespace kda {

DeltaRuleLayer::DeltaRuleLayer(DType act_dtype, Communicator* tp, WeightFormat weights_format)
    : act_dtype_(act_dtype), weights_format_(weights_format), tp_(tp) {
  Check(act_dtype == DType::kF32 || act_dtype == DType::kBF16, "delta-rule layer: dtype must be F32 or BF16");
}

DeltaRuleLayer::~DeltaRuleLayer() = default;

void DeltaRuleLayer::CheckWeights(const LayerWeights& w, const TensorTable& table, const std::string& who) {
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

void DeltaRuleLayer::SetCore(const LayerWeights& w, const std::string& out_name,
                             std::unique_ptr<RadixLinearAttention> attn, std::vector<float> norm_weight) {
  const DeltaRuleGeometry& geo = attn->geometry();
  Check(static_cast<int64_t>(norm_weight.size()) == geo.V, "delta-rule layer: the norm weight must be [V]");
  // The output projection [hidden, HV*V] is built like the others, then set apart.
  const int64_t cols = geo.value_dim();
  AddProjection(w, {{out_name, 0, geo.hidden}}, cols, out_name);
  out_proj_ = std::move(projections_.back());
  projections_.pop_back();
  attn_ = std::move(attn);
  norm_weight_ = std::move(norm_weight);
  if (act_dtype_ == DType::kBF16) {
    for (float& x : norm_weight_) x = RoundBF16(x);
  }
}

std::vector<float> DeltaRuleLayer::ConvWeight(const std::vector<const std::vector<float>*>& groups,
                                              const DeltaRuleGeometry& geometry) const {
  const int64_t width[3] = {geometry.key_dim(), geometry.key_dim(), geometry.value_dim()};
  Check(groups.size() == 3, "delta-rule layer: the conv has three groups (q, k, v)");
  std::vector<float> r;
  r.reserve(static_cast<size_t>(geometry.conv_channels() * geometry.W));
  for (int g = 0; g < 3; ++g) {
    const std::vector<float> t = ShortConvWeightFromCheckpoint(*groups[g], width[g], geometry.W);
    r.insert(r.end(), t.begin(), t.end());
  }
  if (act_dtype_ == DType::kBF16 && !geometry.conv_weights_f32) {
    for (float& x : r) x = RoundBF16(x);
  }
  return r;
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
  attn_->Forward(backend, o.mut(), pr.mixed_qkv.view(), pr.gate_raw.view(), pr.beta_logits.view());
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kOutputGate, pr.output_gate.view(), pr.output_gate.size());

  // Gated RMSNorm per token and value head over V, then the output projection.
  ActBuffer normed = ActBuffer::Uninitialized(dt, T * geo.value_dim());
  GatedRmsNorm(normed.mut(), o.view(), pr.output_gate.view(), norm_weight_.data(), T, geo.HV, geo.V,
               static_cast<float>(geo.rms_norm_eps), geo.output_gate);
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

}  // namespace kda
