// Int8 projection weights in the whole layer, tested exactly (design §5): the
// kInt8 layer against the existing layer built from the dequantized weights
// (DequantizeLayerWeights), with the fp32 rule in the fp32 pipeline and
// bf16 rule v2 in the bf16 pipeline (r: the bf16 layer on the dequantized
// weights; x: the fp32 layer on them), on golden cases at the mini and the
// real shapes. Each case runs the whole packed batch (large M: the
// dequantized-panel GEMM) and one token of every sequence (M = N <= 16: the
// small-M kernel). How far int8 moves the output from the bf16-weight layer is
// printed as information (relL2), not asserted.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/base/tolerance.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/q8.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "tests/golden.h"
#include "tests/layer_states.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;
using testing::AllCloseStateF32;

using Int8Case = testing::GoldenCase;

double RelL2(const std::vector<float>& a, const std::vector<float>& r) {
  double num = 0.0;
  double den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - r[i]) * (static_cast<double>(a[i]) - r[i]);
    den += static_cast<double>(r[i]) * r[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

class Int8LayerTest : public ::testing::TestWithParam<Int8Case> {
 protected:
  void SetUp() override {
    const std::string dir = testing::GoldenSetDir(GetParam().dir);
    const std::string file = dir + "/" + GetParam().name + ".safetensors";
    KDA_REQUIRE_GOLDEN_PATH(file);
    const ModelConfig config = LoadModelConfig(dir);
    family_ = &LayerFamilyFor(config.model_type);
    shape_ = family_->geometry(config);
    const Checkpoint ckpt = Checkpoint::Open(dir);
    const TensorTable table = family_->tensors(shape_);
    weights_ = LoadLayerWeights(ckpt, LayerKeyPrefix(ckpt, *family_, 0), table, MakeHeadShard(shape_.H, 0, 1));
    deq_ = DequantizeLayerWeights(weights_, table);
    const SafetensorsFile f = SafetensorsFile::Open(file);
    x_ = ToFloatVector(f.Get("hidden_states"));
    cu_ = ToInt64Vector(f.Get("cu_seqlens"));
    if (f.Has("initial_recurrent_state")) {
      init_rec_ = ToFloatVector(f.Get("initial_recurrent_state"));
      init_conv_ = ToFloatVector(f.Get("initial_conv_state"));
    }
  }

  struct Result {
    std::vector<float> out, rec, conv;
  };

  // One EXTEND step of the sequences [cu[n], cu[n+1]) (first_token_only: only
  // each sequence's first token), seeded with the case's initial states.
  Result Run(const LayerWeights& w, DType dtype, WeightFormat format, bool first_token_only) const {
    const std::unique_ptr<DeltaRuleLayer> layer = family_->MakeLayer(0, shape_, w, dtype, nullptr, format);
    const DeltaRuleLayer& attn = *layer;
    EXPECT_EQ(attn.weights_format(), format);
    const int64_t n_seq = static_cast<int64_t>(cu_.size()) - 1;
    RecurrentStatePool pool(1, n_seq, shape_.state_spec(), dtype);
    HybridReqToTokenPool req_pool(&pool);
    DeltaRuleAttnBackend backend({&pool, &req_pool}, KernelImpl::kReference);
    const int64_t rs = shape_.state_spec().recurrent_size();
    const int64_t cs = shape_.state_spec().conv_size();
    const int64_t hid = shape_.hidden;
    ForwardBatch batch;
    batch.mode = ForwardMode::kExtend;
    std::vector<float> xin;
    for (int64_t n = 0; n < n_seq; ++n) {
      const int32_t slot = req_pool.Alloc(n);
      if (!init_rec_.empty()) {
        ActBuffer conv(dtype, cs);
        for (int64_t i = 0; i < cs; ++i) conv.Set(i, init_conv_[n * cs + i]);
        pool.SetLayerState(0, slot, init_rec_.data() + n * rs, conv.data());
      }
      const int64_t len = first_token_only ? 1 : cu_[n + 1] - cu_[n];
      xin.insert(xin.end(), x_.begin() + cu_[n] * hid, x_.begin() + (cu_[n] + len) * hid);
      batch.req_ids.push_back(n);
      batch.req_pool_indices.push_back(slot);
      batch.extend_lens.push_back(len);
      batch.prefix_lens.push_back(0);
      batch.state_seeded.push_back(init_rec_.empty() ? 0 : 1);
    }
    backend.InitForwardMetadata(batch);
    ActBuffer x(dtype, static_cast<int64_t>(xin.size()));
    for (size_t i = 0; i < xin.size(); ++i) x.Set(static_cast<int64_t>(i), xin[i]);
    ActBuffer out(dtype, static_cast<int64_t>(xin.size()));
    attn.Forward(out.mut(), x.view(), backend);
    Result r;
    r.out = out.ToFloat();
    testing::AppendLayerStates(pool, req_pool, n_seq, dtype, r.rec, r.conv);
    return r;
  }

  void CheckBothPipelines(bool first_token_only) {
    const char* what = first_token_only ? "one token per sequence" : "whole batch";
    // fp32 pipeline: the int8 layer vs the fp32 layer on the dequantized weights.
    const Result a32 = Run(weights_, DType::kF32, WeightFormat::kInt8, first_token_only);
    const Result x32 = Run(deq_, DType::kF32, WeightFormat::kDense, first_token_only);
    EXPECT_TRUE(AllCloseF32(a32.out.data(), x32.out.data(), x32.out.size())) << what << ": out";
    EXPECT_TRUE(AllCloseStateF32(a32.rec.data(), x32.rec.data(), x32.rec.size())) << what << ": recurrent";
    EXPECT_TRUE(AllCloseStateF32(a32.conv.data(), x32.conv.data(), x32.conv.size())) << what << ": conv";
    // bf16 pipeline: rule v2, r the bf16 layer on the dequantized weights, x the fp32 one.
    const Result a16 = Run(weights_, DType::kBF16, WeightFormat::kInt8, first_token_only);
    const Result r16 = Run(deq_, DType::kBF16, WeightFormat::kDense, first_token_only);
    EXPECT_TRUE(AllCloseBF16(a16.out.data(), r16.out.data(), x32.out.data(), x32.out.size())) << what << ": out";
    EXPECT_TRUE(AllCloseBF16(a16.rec.data(), r16.rec.data(), x32.rec.data(), x32.rec.size())) << what << ": recurrent";
    // Information: how far int8 weights move the output from the checkpoint's weights.
    const Result b32 = Run(weights_, DType::kF32, WeightFormat::kDense, first_token_only);
    const Result b16 = Run(weights_, DType::kBF16, WeightFormat::kDense, first_token_only);
    std::cout << "[int8 vs bf16 weights] " << GetParam().dir << "/" << GetParam().name << " (" << what
              << "): out relL2 fp32 pipeline " << RelL2(a32.out, b32.out) << ", bf16 pipeline "
              << RelL2(a16.out, b16.out) << "; recurrent state relL2 " << RelL2(a32.rec, b32.rec) << "\n";
  }

  const LayerFamily* family_ = nullptr;
  DeltaRuleGeometry shape_;
  LayerWeights weights_, deq_;
  std::vector<float> x_, init_rec_, init_conv_;
  std::vector<int64_t> cu_;
};

TEST_P(Int8LayerTest, WholeBatchEqualsLayerOnDequantizedWeights) { CheckBothPipelines(false); }

TEST_P(Int8LayerTest, OneTokenPerSequenceEqualsLayerOnDequantizedWeights) { CheckBothPipelines(true); }

INSTANTIATE_TEST_SUITE_P(
    Golden, Int8LayerTest,
    ::testing::Values(
        Int8Case{"kda-mini", "single_T1"}, Int8Case{"kda-mini", "single_T64"}, Int8Case{"kda-mini", "varlen_initstate"},
        Int8Case{"kda-loud", "loud_varlen_initstate"}, Int8Case{"kda-stress", "stress_varlen_initstate"},
        Int8Case{"generated/kda-real", "real_varlen_initstate"}, Int8Case{"gdn-mini", "varlen_initstate"},
        Int8Case{"gdn-gva3", "varlen_initstate"}, Int8Case{"gdn-loud", "loud_varlen_initstate"},
        Int8Case{"generated/glm5-mini", "varlen_initstate"}, Int8Case{"generated/bailing-mini", "varlen_initstate"},
        Int8Case{"generated/olmo-mini", "varlen_initstate"}, Int8Case{"generated/lara-mini", "varlen_initstate"},
        Int8Case{"generated/qwen4-mini", "varlen_initstate"}, Int8Case{"mamba2-mini", "varlen_initstate"},
        Int8Case{"mamba2-groups", "varlen_initstate"}, Int8Case{"mamba2-loud", "loud_varlen_initstate"},
        Int8Case{"mamba2-falcon", "varlen_initstate"}, Int8Case{"mamba2-zamba", "varlen_initstate"}),
    testing::GoldenCaseName);

TEST(Int8Layer, InputDimNotAMultipleOf32IsRefused) {
  const DeltaRuleGeometry s = DeltaRuleGeometry::Kda(/*hidden=*/48, /*heads=*/2, /*head_dim=*/32, /*conv_width=*/4,
                                                     /*eps=*/1e-5);
  const LayerWeights w = RandomLayerWeights(LayerFamilyFor("kimi_linear").tensors(s), 1);
  try {
    LayerFamilyFor("kimi_linear").MakeLayer(0, s, w, DType::kF32, nullptr, WeightFormat::kInt8);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_proj|k_proj|v_proj has input dim 48, which is not a multiple of the "
                                         "block size 32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kda
