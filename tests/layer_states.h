// What the layer tests share: the states a layer step leaves in a state pool,
// read back; the tensors a layer shows its observer; activations from fp32.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/dtype.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/layer_family.h"
#include "tests/golden.h"
#include "tests/tolerance.h"

namespace kda::testing {

// Layer 0's states of requests 0 .. n-1, as fp32, appended one request after
// another: recurrent [n, HV, K, V] to `rec`, conv [n, W-1, C] (C conv
// channels, stored as conv_dtype) to `conv`.
inline void AppendLayerStates(const RecurrentStatePool& pool, const HybridReqToTokenPool& req_pool, int64_t n,
                              DType conv_dtype, std::vector<float>& rec, std::vector<float>& conv) {
  const int64_t rs = pool.spec().recurrent_size();
  ActBuffer tail(conv_dtype, pool.spec().conv_size());
  std::vector<float> state(static_cast<size_t>(rs));
  for (int64_t i = 0; i < n; ++i) {
    pool.GetLayerState(0, req_pool.SlotOf(i), state.data(), tail.data());
    rec.insert(rec.end(), state.begin(), state.end());
    const std::vector<float> c = tail.ToFloat();
    conv.insert(conv.end(), c.begin(), c.end());
  }
}

// Every tensor a layer shows its observer, as fp32 values.
struct TensorRecorder : LayerObserver {
  std::map<LayerTensor, std::vector<float>> tensors;

  void OnTensor(int /*layer_id*/, LayerTensor which, ConstBuf values, int64_t count) override {
    std::vector<float>& dst = tensors[which];
    dst.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) dst[i] = LoadAsFloat(values.data, values.dtype, static_cast<size_t>(i));
  }
};

// v[begin, begin + n) in `dtype`.
inline ActBuffer ToAct(DType dtype, const std::vector<float>& v, int64_t begin, int64_t n) {
  ActBuffer b(dtype, n);
  for (int64_t i = 0; i < n; ++i) b.Set(i, v[static_cast<size_t>(begin + i)]);
  return b;
}

// The golden sets' names of the intermediates a layer shows its observer: the conv outputs, the raw and the
// activated gate, beta, the core's output and the output gate's input, by layer kind (KDA, Gated DeltaNet,
// a Mamba2 mixer).
inline std::vector<std::pair<const char*, LayerTensor>> GoldenIntermediates(const DeltaRuleGeometry& g) {
  const bool gdn = g.decay == DecayWidth::kPerValueHead;
  if (g.ssd) {
    return {{"C_conv", LayerTensor::kQConv},     {"B_conv", LayerTensor::kKConv},   {"x_conv", LayerTensor::kVConv},
            {"dt_raw", LayerTensor::kGateRaw},   {"log_decay", LayerTensor::kGate}, {"dt", LayerTensor::kBeta},
            {"y_ssm", LayerTensor::kCoreOutput}, {"z", LayerTensor::kOutputGate}};
  }
  return {{"q_conv", LayerTensor::kQConv},
          {"k_conv", LayerTensor::kKConv},
          {"v_conv", LayerTensor::kVConv},
          {"g_raw", LayerTensor::kGateRaw},
          {"g", LayerTensor::kGate},
          {"beta", LayerTensor::kBeta},
          {gdn ? "o_gdn" : "o_kda", LayerTensor::kCoreOutput},
          {gdn ? "z" : "g_out", LayerTensor::kOutputGate}};
}

// One golden case, loaded (a parameterised test's fixture): its set's config and layer geometry, its fp32
// tensors by name, its sequences.
class GoldenCaseTest : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override {
    model_dir_ = GoldenSetDir(GetParam().dir);
    const std::string file = model_dir_ + "/" + GetParam().name + ".safetensors";
    KDA_REQUIRE_GOLDEN_PATH(file);
    config_ = LoadModelConfig(model_dir_);
    shape_ = LayerFamilyFor(config_.model_type).geometry(config_);
    const SafetensorsFile f = SafetensorsFile::Open(file);
    for (const TensorInfo& t : f.tensors()) {
      if (t.dtype == DType::kF32) tensors_[t.name] = ToFloatVector(t);
    }
    cu_ = ToInt64Vector(f.Get("cu_seqlens"));
    T_ = cu_.back();
    N_ = static_cast<int64_t>(cu_.size()) - 1;
  }

  // The case's tensor `name` (a failure, and an empty vector, when it has none).
  const std::vector<float>& Tensor(const std::string& name) const {
    static const std::vector<float> kNone;
    const auto it = tensors_.find(name);
    EXPECT_NE(it, tensors_.end()) << name;
    return it == tensors_.end() ? kNone : it->second;
  }
  bool HasInit() const { return tensors_.count("initial_recurrent_state") > 0; }

  // A layer run's output and final states (fp32 values) against the case's: the fp32 pipeline by the fp32 rule
  // (the states by the state rule), the bf16 pipeline by rule v2, its conv tail against the exact tail rounded
  // once (the reference pipeline's cast point after the projection).
  void ExpectOutputAndStates(DType dtype, const std::vector<float>& out, const std::vector<float>& rec,
                             const std::vector<float>& conv) const {
    const std::vector<float>& exact = Tensor("out_fp32");
    const std::vector<float>& rec_exact = Tensor("final_recurrent_state");
    const std::vector<float>& conv_exact = Tensor("final_conv_state");
    if (dtype == DType::kF32) {
      EXPECT_TRUE(AllCloseF32(out.data(), exact.data(), out.size())) << "out";
      EXPECT_TRUE(AllCloseStateF32(rec.data(), rec_exact.data(), rec.size())) << "recurrent";
      EXPECT_TRUE(AllCloseStateF32(conv.data(), conv_exact.data(), conv.size())) << "conv";
      return;
    }
    EXPECT_TRUE(AllCloseBF16(out.data(), Tensor("out_bf16").data(), exact.data(), out.size())) << "out";
    EXPECT_TRUE(AllCloseBF16(rec.data(), Tensor("final_recurrent_state_bf16").data(), rec_exact.data(), rec.size()))
        << "recurrent";
    const std::vector<float> conv_ref = RoundedBF16(conv_exact);
    EXPECT_TRUE(AllCloseBF16(conv.data(), conv_ref.data(), conv_exact.data(), conv.size())) << "conv";
  }

  // Each tensor a layer showed its observer (`seen`) against the case's of that name: by the state rule those
  // in `scaled` (sums that can cancel, whose fp32 error scales with the tensor as a state's does), else by the
  // fp32 rule.
  void ExpectIntermediates(const std::map<LayerTensor, std::vector<float>>& seen,
                           const std::vector<std::pair<const char*, LayerTensor>>& names,
                           const std::vector<LayerTensor>& scaled) const {
    for (const auto& [name, which] : names) {
      const std::vector<float>& want = Tensor(name);
      ASSERT_EQ(seen.count(which), 1U) << name;
      const std::vector<float>& got = seen.at(which);
      ASSERT_EQ(got.size(), want.size()) << name;
      const bool state_rule = std::find(scaled.begin(), scaled.end(), which) != scaled.end();
      EXPECT_TRUE(state_rule ? AllCloseStateF32(got.data(), want.data(), want.size())
                             : AllCloseF32(got.data(), want.data(), want.size()))
          << name;
    }
  }

  std::string model_dir_;
  ModelConfig config_;
  DeltaRuleGeometry shape_;
  std::map<std::string, std::vector<float>> tensors_;
  std::vector<int64_t> cu_;
  int64_t T_ = 0;
  int64_t N_ = 0;
};

}  // namespace kda::testing
