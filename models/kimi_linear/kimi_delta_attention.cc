#include "kda/models/kimi_delta_attention.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "base/act_buffer.h"
#include "kda/base/error.h"
#include "kda/distributed/communicator.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/q8.h"
#include "kda/kernels/short_conv.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/models/weights.h"

namespace kda {
namespace {

std::vector<float> Concat3(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
  std::vector<float> r;
  r.reserve(a.size() + b.size() + c.size());
  r.insert(r.end(), a.begin(), a.end());
  r.insert(r.end(), b.begin(), b.end());
  r.insert(r.end(), c.begin(), c.end());
  return r;
}

void CheckShape(const Q8Weight& w, int64_t rows, int64_t cols, const char* name) {
  Check(w.rows == rows && w.cols == cols, std::string("KimiDeltaAttention: int8 weight ") + name + " has shape [" +
                                              std::to_string(w.rows) + ", " + std::to_string(w.cols) + "], expected [" +
                                              std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

void CheckSize(const std::vector<float>& v, int64_t n, const char* name) {
  Check(static_cast<int64_t>(v.size()) == n, std::string("KimiDeltaAttention: weight ") + name + " has " +
                                                 std::to_string(v.size()) + " values, expected " + std::to_string(n));
}

// One projection in the chosen weight format.
std::unique_ptr<Linear> MakeLinear(const std::vector<float>& w, int64_t out, int64_t in, DType dtype,
                                   WeightFormat format, const std::string& name) {
  if (format == WeightFormat::kInt8) return std::make_unique<Linear>(QuantizeQ8(w, out, in, name), dtype);
  return std::make_unique<Linear>(w, out, in, dtype);
}

}  // namespace

KimiDeltaAttention::KimiDeltaAttention(int layer_id, const KdaLayerShape& shape, const KdaLayerWeights& w,
                                       DType act_dtype, Communicator* tp, WeightFormat weights_format)
    : shape_(shape), act_dtype_(act_dtype), tp_(tp) {
  Check(act_dtype == DType::kF32 || act_dtype == DType::kBF16, "KimiDeltaAttention: dtype must be F32 or BF16");
  Check(shape.hidden > 0 && shape.H > 0 && shape.W >= 1, "KimiDeltaAttention: invalid shape");
  Check(shape.K % 16 == 0 && shape.K >= 16 && shape.K <= 256,
        "KimiDeltaAttention: head dim must be a multiple of 16 in [16, 256], got " + std::to_string(shape.K));
  const int64_t hid = shape.hidden;
  const int64_t p = shape.P();
  const int64_t kd = shape.K;
  if (w.q8) {
    Check(weights_format == WeightFormat::kInt8,
          "the weights are int8 (a kda quantize checkpoint): load them with --weights int8 (WeightFormat::kInt8)");
    const KdaLayerQ8Weights& q = *w.q8;
    CheckShape(q.q_proj, p, hid, "q_proj");
    CheckShape(q.k_proj, p, hid, "k_proj");
    CheckShape(q.v_proj, p, hid, "v_proj");
    CheckShape(q.f_a_proj, kd, hid, "f_a_proj");
    CheckShape(q.f_b_proj, p, kd, "f_b_proj");
    CheckShape(q.b_proj, shape.H, hid, "b_proj");
    CheckShape(q.g_a_proj, kd, hid, "g_a_proj");
    CheckShape(q.g_b_proj, p, kd, "g_b_proj");
    CheckShape(q.o_proj, hid, p, "o_proj");
  } else {
    CheckSize(w.q_proj, p * hid, "q_proj");
    CheckSize(w.k_proj, p * hid, "k_proj");
    CheckSize(w.v_proj, p * hid, "v_proj");
    CheckSize(w.f_a_proj, kd * hid, "f_a_proj");
    CheckSize(w.f_b_proj, p * kd, "f_b_proj");
    CheckSize(w.b_proj, shape.H * hid, "b_proj");
    CheckSize(w.g_a_proj, kd * hid, "g_a_proj");
    CheckSize(w.g_b_proj, p * kd, "g_b_proj");
    CheckSize(w.o_proj, hid * p, "o_proj");
  }
  CheckSize(w.q_conv, p * shape.W, "q_conv1d");
  CheckSize(w.k_conv, p * shape.W, "k_conv1d");
  CheckSize(w.v_conv, p * shape.W, "v_conv1d");
  CheckSize(w.A_log, shape.H, "A_log");
  CheckSize(w.dt_bias, p, "dt_bias");
  CheckSize(w.o_norm, kd, "o_norm");

  // q|k|v share one GEMM: their outputs are the conv's 3P channels in order.
  // (Q8 blocks lie within one output row, so quantizing the concatenation is
  // quantizing each.)
  const WeightFormat f = weights_format;
  if (w.q8) {
    const KdaLayerQ8Weights& q = *w.q8;
    qkv_proj_ = std::make_unique<Linear>(ConcatQ8Rows({&q.q_proj, &q.k_proj, &q.v_proj}), act_dtype);
    f_a_proj_ = std::make_unique<Linear>(q.f_a_proj, act_dtype);
    f_b_proj_ = std::make_unique<Linear>(q.f_b_proj, act_dtype);
    b_proj_ = std::make_unique<Linear>(q.b_proj, act_dtype);
    g_a_proj_ = std::make_unique<Linear>(q.g_a_proj, act_dtype);
    g_b_proj_ = std::make_unique<Linear>(q.g_b_proj, act_dtype);
    o_proj_ = std::make_unique<Linear>(q.o_proj, act_dtype);
  } else {
    qkv_proj_ = MakeLinear(Concat3(w.q_proj, w.k_proj, w.v_proj), 3 * p, hid, act_dtype, f, "q_proj|k_proj|v_proj");
    f_a_proj_ = MakeLinear(w.f_a_proj, kd, hid, act_dtype, f, "f_a_proj");
    f_b_proj_ = MakeLinear(w.f_b_proj, p, kd, act_dtype, f, "f_b_proj");
    b_proj_ = MakeLinear(w.b_proj, shape.H, hid, act_dtype, f, "b_proj");
    g_a_proj_ = MakeLinear(w.g_a_proj, kd, hid, act_dtype, f, "g_a_proj");
    g_b_proj_ = MakeLinear(w.g_b_proj, p, kd, act_dtype, f, "g_b_proj");
    o_proj_ = MakeLinear(w.o_proj, hid, p, act_dtype, f, "o_proj");
  }
  // The convs in the kernels' tap-major layout, laid out once here: [3][W][P] (q|k|v).
  std::vector<float> conv_w =
      Concat3(ShortConvWeightFromCheckpoint(w.q_conv, p, shape.W), ShortConvWeightFromCheckpoint(w.k_conv, p, shape.W),
              ShortConvWeightFromCheckpoint(w.v_conv, p, shape.W));
  o_norm_ = w.o_norm;
  if (act_dtype == DType::kBF16) {
    for (float& x : conv_w) x = RoundBF16(x);
    for (float& x : o_norm_) x = RoundBF16(x);
  }
  // A_log and dt_bias stay fp32 parameters (design §1).
  attn_ = std::make_unique<RadixLinearAttention>(layer_id, shape.H, shape.K, shape.K, shape.W, std::move(conv_w),
                                                 w.A_log, w.dt_bias, 1.0F / std::sqrt(static_cast<float>(shape.K)));
}

int64_t KimiDeltaAttention::projection_weight_bytes() const {
  int64_t n = 0;
  for (const auto* l : {&qkv_proj_, &f_a_proj_, &f_b_proj_, &b_proj_, &g_a_proj_, &g_b_proj_, &o_proj_}) {
    n += (*l)->weight_bytes();
  }
  return n;
}

KimiDeltaAttention::~KimiDeltaAttention() = default;
KimiDeltaAttention::KimiDeltaAttention(KimiDeltaAttention&&) noexcept = default;
KimiDeltaAttention& KimiDeltaAttention::operator=(KimiDeltaAttention&&) noexcept = default;

struct KimiDeltaAttention::Projected {
  ActBuffer qkv, f_a, f_b, b_logits, g_a, g_b;
};

void KimiDeltaAttention::CheckInputDtype(ConstBuf x) const {
  Check(x.dtype == act_dtype_, std::string("hidden_states dtype ") + DTypeName(x.dtype) +
                                   " does not match the layer dtype " + DTypeName(act_dtype_));
}

KimiDeltaAttention::Projected KimiDeltaAttention::ProjectInputs(ConstBuf x, int64_t T) const {
  // fp32 accumulation, rounded once in the bf16 pipeline.
  const int64_t p = shape_.P();
  const DType dt = act_dtype_;
  Projected r{ActBuffer::Uninitialized(dt, T * 3 * p),    ActBuffer::Uninitialized(dt, T * shape_.K),
              ActBuffer::Uninitialized(dt, T * p),        ActBuffer::Uninitialized(dt, T * shape_.H),
              ActBuffer::Uninitialized(dt, T * shape_.K), ActBuffer::Uninitialized(dt, T * p)};
  qkv_proj_->Forward(r.qkv.mut(), x, T);
  f_a_proj_->Forward(r.f_a.mut(), x, T);
  f_b_proj_->Forward(r.f_b.mut(), r.f_a.view(), T);
  b_proj_->Forward(r.b_logits.mut(), x, T);
  g_a_proj_->Forward(r.g_a.mut(), x, T);
  g_b_proj_->Forward(r.g_b.mut(), r.g_a.view(), T);
  return r;
}

void KimiDeltaAttention::ForwardProjections(ConstBuf x, int64_t T) const {
  CheckInputDtype(x);
  Check(T >= 0 && (T == 0 || x.data != nullptr), "KimiDeltaAttention: null input or negative token count");
  if (T == 0) return;
  const Projected pr = ProjectInputs(x, T);
  ActBuffer out = ActBuffer::Uninitialized(act_dtype_, T * shape_.hidden);
  o_proj_->Forward(out.mut(), pr.f_b.view(), T);
}

void KimiDeltaAttention::Forward(MutBuf out, ConstBuf x, LinearRecurrentAttnBackend& backend) const {
  CheckInputDtype(x);
  Check(out.dtype == act_dtype_, "KimiDeltaAttention: output dtype does not match the layer dtype");
  const int64_t T = backend.metadata().num_tokens;
  Check(T == 0 || (x.data != nullptr && out.data != nullptr), "KimiDeltaAttention: null input or output");
  if (T == 0) {
    // IDLE or an all-empty batch still runs the backend (it leaves no state
    // behind for empty sequences but keeps their tails and states as they are).
    backend.Forward(*attn_, out, x, x, x);
    return;
  }
  const int64_t p = shape_.P();
  const int H = shape_.H;
  const int K = shape_.K;
  const DType dt = act_dtype_;
  const int layer_id = attn_->layer_id();
  LayerObserver* obs = backend.observer();
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kInput, x, T * shape_.hidden);

  const Projected pr = ProjectInputs(x, T);

  // The attention core: conv, gates, kernel, states.
  ActBuffer o = ActBuffer::Uninitialized(dt, T * p);
  attn_->Forward(backend, o.mut(), pr.qkv.view(), pr.f_b.view(), pr.b_logits.view());
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kOutputGate, pr.g_b.view(), pr.g_b.size());

  // Gated RMSNorm per token and head over V (sigmoid gate), then o_proj.
  ActBuffer normed = ActBuffer::Uninitialized(dt, T * p);
  GatedRmsNorm(normed.mut(), o.view(), pr.g_b.view(), o_norm_.data(), T, H, K, static_cast<float>(shape_.rms_norm_eps),
               GateActivation::kSigmoid);
  if (tp_ == nullptr || tp_->size() == 1) {
    o_proj_->Forward(out, normed.view(), T);
  } else {
    // Tensor parallel: fp32 partial sums over this rank's heads, summed across
    // ranks, then the one cast point of the bf16 pipeline.
    std::vector<float> partial(static_cast<size_t>(T * shape_.hidden));
    o_proj_->Forward({partial.data(), DType::kF32}, normed.view(), T);
    tp_->AllReduceSum(partial.data(), static_cast<int64_t>(partial.size()));
    for (size_t i = 0; i < partial.size(); ++i) StoreFromFloat(out.data, out.dtype, i, partial[i]);
  }
  if (obs != nullptr) obs->OnTensor(layer_id, LayerTensor::kOutput, {out.data, out.dtype}, T * shape_.hidden);
}

}  // namespace kda
