#include "tools/layer_replay.h"

#include <string>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/serving/serving_stack.h"

namespace kda::cli {

void RequestTrace::OnBatch(const ForwardBatch& batch) {
  at_ = RowsOf(batch, req_id_);
  tokens_ = batch.num_tokens();
}

void RequestTrace::OnTensor(int layer_id, LayerTensor which, ConstBuf values, int64_t count) {
  if (at_.rows == 0 || (which != LayerTensor::kInput && which != LayerTensor::kOutput)) return;
  row_bytes_ = static_cast<size_t>(count / tokens_) * DTypeSize(values.dtype);
  const auto* p = static_cast<const uint8_t*>(values.data) + static_cast<size_t>(at_.begin) * row_bytes_;
  std::vector<uint8_t>& dst = (which == LayerTensor::kInput ? inputs_ : outputs_).at(static_cast<size_t>(layer_id));
  dst.insert(dst.end(), p, p + static_cast<size_t>(at_.rows) * row_bytes_);
}

void RequestTrace::KeepFirst(int64_t n) {
  Check(n >= 0 && n <= at_.rows,
        "trace: cannot keep " + std::to_string(n) + " of the " + std::to_string(at_.rows) + " rows of the last step");
  const size_t drop = static_cast<size_t>(at_.rows - n) * row_bytes_;
  for (auto* layers : {&inputs_, &outputs_}) {
    for (std::vector<uint8_t>& rows : *layers) rows.resize(rows.size() - drop);
  }
  at_.rows = n;
}

namespace {

// One layer's replay: its output rows and final recurrent state.
struct Replayed {
  std::vector<float> out;
  std::vector<float> state;
};

// The traced request again, alone, each layer of `model` fed the input that
// layer saw while served (converted to the model's activation dtype): rows
// [0, decode_from) in one EXTEND step, then one DECODE step per row.
std::vector<Replayed> ReplayLayers(const DeltaRuleModel& model, const RequestTrace& trace, DType trace_dt,
                                   KernelImpl kernel, int64_t decode_from) {
  const int L = model.num_layers();
  const DType dt = model.act_dtype;
  const int64_t hidden = model.geometry.hidden;
  const auto rows =
      static_cast<int64_t>(trace.inputs().at(0).size() / (static_cast<size_t>(hidden) * DTypeSize(trace_dt)));
  const int64_t first = decode_from < 0 ? rows : std::min(decode_from, rows);
  ServingOptions options;
  options.kernel = kernel;
  ServingStack stack(model, options, 1);
  const int32_t slot = stack.req_pool().Alloc(trace.req_id());
  // The steps: [0, first) at once, then one row each.
  std::vector<std::pair<int64_t, int64_t>> steps;
  if (first > 0) steps.emplace_back(0, first);
  for (int64_t t = first; t < rows; ++t) steps.emplace_back(t, 1);
  const int64_t rs = model.state_spec().recurrent_size();
  std::vector<Replayed> r(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    const std::vector<float> in = BytesToFloat(trace.inputs()[l], trace_dt);
    ActBuffer x(dt, rows * hidden);
    for (int64_t i = 0; i < rows * hidden; ++i) x.Set(i, in[static_cast<size_t>(i)]);
    ActBuffer out(dt, rows * hidden);
    for (const auto& [begin, n] : steps) {
      ForwardBatch batch;
      batch.mode = begin < first ? ForwardMode::kExtend : ForwardMode::kDecode;
      batch.req_ids = {trace.req_id()};
      batch.req_pool_indices = {slot};
      batch.extend_lens = {n};
      batch.prefix_lens = {begin};
      stack.runner().ForwardLayer(l, batch, Offset(x.view(), begin * hidden), Offset(out.mut(), begin * hidden));
    }
    r[l].out = out.ToFloat();
    r[l].state.resize(static_cast<size_t>(rs));
    stack.pool().GetLayerState(l, slot, r[l].state.data(), nullptr);
  }
  return r;
}

}  // namespace

SelfCheck ReplayCheck(const DeltaRuleModel& model, const DeltaRuleModel* exact, const RequestTrace& trace,
                      const RequestResult& served, KernelImpl kernel, int64_t decode_from) {
  const DType dt = model.act_dtype;
  const std::vector<Replayed> ref = ReplayLayers(model, trace, dt, kernel, decode_from);
  std::vector<Replayed> ex;
  if (dt == DType::kBF16) {
    Check(exact != nullptr && exact->act_dtype == DType::kF32, "bench: the bf16 self-check needs the fp32 layers");
    ex = ReplayLayers(*exact, trace, dt, kernel, decode_from);
  }
  const int64_t rs = model.state_spec().recurrent_size();
  SelfCheck c;
  for (int l = 0; l < model.num_layers(); ++l) {
    const std::vector<float> got = BytesToFloat(trace.outputs()[l], dt);
    const std::vector<float>& want = ref[l].out;
    const float* served_state = served.final_recurrent.data() + l * rs;
    const std::vector<float>& state = ref[l].state;
    const ToleranceReport o = dt == DType::kF32 ? CompareF32(got.data(), want.data(), want.size())
                                                : CompareBF16(got.data(), want.data(), ex[l].out.data(), want.size());
    const ToleranceReport s = dt == DType::kF32
                                  ? CompareF32(served_state, state.data(), state.size())
                                  : CompareBF16(served_state, state.data(), ex[l].state.data(), state.size());
    if (l == 0 || o.max_ratio > c.out.max_ratio) c.out = o;
    if (l == 0 || s.max_ratio > c.state.max_ratio) c.state = s;
    c.pass = c.pass && o.ok && s.ok;
  }
  return c;
}

}  // namespace kda::cli
