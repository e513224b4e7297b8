// The layer and both kernels against the golden cases (an independent float64
// implementation), fp32 and bf16 pipelines, with the tolerances of design §5.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "base/act_buffer.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/attention/linear/kda_backend.h"
#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/kimi_delta_attention.h"
#include "kda/models/weights.h"
#include "tests/golden.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;
using testing::AllCloseStateF32;
using testing::RoundedBF16;

struct GoldenCase {
  std::string dir;  // kda-mini | kda-stress | generated/kda-real (see tests/golden.h)
  std::string name;
};

// Every tensor the layer shows its observer, as fp32 values.
struct TensorRecorder : LayerObserver {
  std::map<LayerTensor, std::vector<float>> tensors;

  void OnTensor(int /*layer_id*/, LayerTensor which, ConstBuf values, int64_t count) override {
    std::vector<float>& dst = tensors[which];
    dst.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) dst[i] = LoadAsFloat(values.data, values.dtype, static_cast<size_t>(i));
  }
};

void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.dir << "/" << c.name; }

std::string CaseName(const ::testing::TestParamInfo<GoldenCase>& info) {
  std::string s = info.param.dir + "_" + info.param.name;
  for (char& c : s) {
    if (c == '-' || c == '/') c = '_';
  }
  return s;
}

const std::vector<GoldenCase>& AllCases() {
  static const std::vector<GoldenCase> cases = {
      {"kda-mini", "single_T1"},
      {"kda-mini", "single_T8"},
      {"kda-mini", "single_T64"},
      {"kda-mini", "single_T65"},
      {"kda-mini", "single_T128"},
      {"kda-mini", "single_T256"},
      {"kda-mini", "single_T1024"},
      {"kda-mini", "varlen_balanced_4x32"},
      {"kda-mini", "varlen_unbalanced_5_17_1_41"},
      {"kda-mini", "varlen_single_T128"},
      {"kda-mini", "single_T128_initstate"},
      {"kda-mini", "varlen_initstate"},
      {"kda-stress", "stress_T64"},
      {"kda-stress", "stress_T300"},
      {"kda-stress", "stress_varlen_initstate"},
      // The real shapes (hidden 2304, 32 heads x 128), written at test time.
      {"generated/kda-real", "real_varlen_initstate"},
  };
  return cases;
}

// One golden case, loaded: the model's layer 0 and the case's tensors.
class GoldenTest : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override {
    model_dir_ = testing::GoldenSetDir(GetParam().dir);
    const std::string file = model_dir_ + "/" + GetParam().name + ".safetensors";
    KDA_REQUIRE_GOLDEN_PATH(file);
    config_ = LoadKimiLinearConfig(model_dir_);
    shape_ = KdaLayerShapeFromConfig(config_);
    const Checkpoint ckpt = Checkpoint::Open(model_dir_);
    weights_ = LoadKdaLayerWeights(ckpt, config_, 0);
    const SafetensorsFile f = SafetensorsFile::Open(file);
    for (const TensorInfo& t : f.tensors()) {
      if (t.dtype == DType::kF32) tensors_[t.name] = ToFloatVector(t);
    }
    cu_ = ToInt64Vector(f.Get("cu_seqlens"));
    T_ = cu_.back();
    N_ = static_cast<int64_t>(cu_.size()) - 1;
  }

  const std::vector<float>& Tensor(const std::string& name) {
    auto it = tensors_.find(name);
    EXPECT_NE(it, tensors_.end()) << name;
    return it->second;
  }
  bool HasInit() const { return tensors_.count("initial_recurrent_state") > 0; }

  struct LayerResult {
    std::vector<float> out, rec, conv;
    std::map<LayerTensor, std::vector<float>> inter;
  };

  // One EXTEND step of the whole packed batch through a state pool and the
  // KDA backend, sequence n in slot n + 1, seeded with the initial states.
  LayerResult RunLayer(DType dtype, KernelImpl kernel = KernelImpl::kReference) {
    const KimiDeltaAttention attn(0, shape_, weights_, dtype);
    RecurrentStatePool pool(1, N_, shape_, dtype);
    HybridReqToTokenPool req_pool(&pool);
    KDAAttnBackend backend({&pool, &req_pool}, kernel);
    TensorRecorder recorder;
    backend.SetObserver(&recorder);
    const int64_t rs = shape_.RecurrentStateSize();
    const int64_t cs = shape_.ConvStateSize();
    ForwardBatch batch;
    batch.mode = ForwardMode::kExtend;
    for (int64_t n = 0; n < N_; ++n) {
      const int32_t slot = req_pool.Alloc(n);
      if (HasInit()) {
        const ActBuffer conv = ToAct(dtype, Tensor("initial_conv_state"), n * cs, cs);
        pool.SetLayerState(0, slot, Tensor("initial_recurrent_state").data() + n * rs, conv.data());
      }
      batch.req_ids.push_back(n);
      batch.extend_lens.push_back(cu_[n + 1] - cu_[n]);
      batch.prefix_lens.push_back(0);
      batch.state_seeded.push_back(HasInit() ? 1 : 0);
    }
    backend.InitForwardMetadata(batch);
    const std::vector<float>& xf = Tensor("hidden_states");
    const ActBuffer x = ToAct(dtype, xf, 0, static_cast<int64_t>(xf.size()));
    ActBuffer out(dtype, static_cast<int64_t>(xf.size()));
    attn.Forward(out.mut(), x.view(), backend);
    LayerResult r;
    r.inter = std::move(recorder.tensors);
    r.out = out.ToFloat();
    ActBuffer conv(dtype, cs);
    for (int64_t n = 0; n < N_; ++n) {
      std::vector<float> rec(static_cast<size_t>(rs));
      pool.GetLayerState(0, req_pool.SlotOf(n), rec.data(), conv.data());
      r.rec.insert(r.rec.end(), rec.begin(), rec.end());
      const std::vector<float> c = conv.ToFloat();
      r.conv.insert(r.conv.end(), c.begin(), c.end());
    }
    return r;
  }

  static ActBuffer ToAct(DType dtype, const std::vector<float>& v, int64_t begin, int64_t n) {
    ActBuffer b(dtype, n);
    for (int64_t i = 0; i < n; ++i) b.Set(i, v[static_cast<size_t>(begin + i)]);
    return b;
  }

  std::string model_dir_;
  KimiLinearConfig config_;
  KdaLayerShape shape_;
  KdaLayerWeights weights_;
  std::map<std::string, std::vector<float>> tensors_;
  std::vector<int64_t> cu_;
  int64_t T_ = 0;
  int64_t N_ = 0;
};

TEST_P(GoldenTest, Fp32PipelineMatchesOutputsStatesAndIntermediates) {
  const LayerResult r = RunLayer(DType::kF32);
  EXPECT_TRUE(AllCloseF32(r.out.data(), Tensor("out_fp32").data(), r.out.size())) << "out";
  EXPECT_TRUE(AllCloseStateF32(r.rec.data(), Tensor("final_recurrent_state").data(), r.rec.size())) << "recurrent";
  EXPECT_TRUE(AllCloseStateF32(r.conv.data(), Tensor("final_conv_state").data(), r.conv.size())) << "conv";
  const std::pair<const char*, LayerTensor> inter[] = {
      {"q_conv", LayerTensor::kQConv},     {"k_conv", LayerTensor::kKConv},    {"v_conv", LayerTensor::kVConv},
      {"g_raw", LayerTensor::kGateRaw},    {"g", LayerTensor::kGate},          {"beta", LayerTensor::kBeta},
      {"o_kda", LayerTensor::kCoreOutput}, {"g_out", LayerTensor::kOutputGate}};
  for (const auto& [name, which] : inter) {
    const std::vector<float>& want = Tensor(name);
    ASSERT_EQ(r.inter.count(which), 1U) << name;
    const std::vector<float>& got = r.inter.at(which);
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_TRUE(AllCloseF32(got.data(), want.data(), want.size())) << name;
  }
  // The layer's own input and output, as its observer was shown them.
  ASSERT_EQ(r.inter.count(LayerTensor::kInput), 1U);
  ASSERT_EQ(r.inter.count(LayerTensor::kOutput), 1U);
  EXPECT_EQ(r.inter.at(LayerTensor::kInput), Tensor("hidden_states"));
  EXPECT_EQ(r.inter.at(LayerTensor::kOutput), r.out);
}

TEST_P(GoldenTest, Bf16PipelineMatchesOutputsAndStates) {
  const LayerResult r = RunLayer(DType::kBF16);
  EXPECT_TRUE(AllCloseBF16(r.out.data(), Tensor("out_bf16").data(), Tensor("out_fp32").data(), r.out.size())) << "out";
  EXPECT_TRUE(AllCloseBF16(r.rec.data(), Tensor("final_recurrent_state_bf16").data(),
                           Tensor("final_recurrent_state").data(), r.rec.size()))
      << "recurrent";
  // The bf16 tail holds the bf16 projections; the golden tail is the fp32
  // pipeline's (exact), and the reference bf16 pipeline's tail is that
  // rounded once (its cast point after the projection).
  const std::vector<float>& conv_exact = Tensor("final_conv_state");
  const std::vector<float> conv_ref = RoundedBF16(conv_exact);
  EXPECT_TRUE(AllCloseBF16(r.conv.data(), conv_ref.data(), conv_exact.data(), r.conv.size())) << "conv";
}

// The kernels alone on the golden kernel inputs (q_conv, k_conv, v_conv, g, beta).
TEST_P(GoldenTest, ChunkAndRecurrentKernelsMatchKernelOutput) {
  const int H = shape_.H;
  const int K = shape_.K;
  const int64_t rs = shape_.RecurrentStateSize();
  std::vector<float> init(static_cast<size_t>(N_ * rs), 0.0F);
  if (HasInit()) init = Tensor("initial_recurrent_state");
  KdaOptions opt;
  opt.scale = 1.0F / std::sqrt(static_cast<float>(K));
  opt.use_qk_l2norm_in_kernel = true;

  std::vector<float> o_chunk(static_cast<size_t>(T_ * H * K), 0.0F);
  std::vector<float> s_chunk(init.size(), 0.0F);
  ChunkKdaArgs c;
  c.o = {o_chunk.data(), DType::kF32};
  c.final_state = s_chunk.data();
  c.q = {Tensor("q_conv").data(), DType::kF32};
  c.k = {Tensor("k_conv").data(), DType::kF32};
  c.v = {Tensor("v_conv").data(), DType::kF32};
  c.g = {Tensor("g").data(), DType::kF32};
  c.beta = {Tensor("beta").data(), DType::kF32};
  c.cu_seqlens = cu_.data();
  c.initial_state = init.data();
  c.T = T_;
  c.N = N_;
  c.H = H;
  c.K = K;
  c.V = K;
  c.options = opt;
  chunk_kda(c, KernelImpl::kReference);
  EXPECT_TRUE(AllCloseF32(o_chunk.data(), Tensor("o_kda").data(), o_chunk.size())) << "chunk o";
  EXPECT_TRUE(AllCloseStateF32(s_chunk.data(), Tensor("final_recurrent_state").data(), s_chunk.size())) << "chunk S";

  // Token by token through the decode kernel, every sequence in its own slot.
  std::vector<float> state = init;
  std::vector<float> o_rec(o_chunk.size(), 0.0F);
  const int64_t hk = static_cast<int64_t>(H) * K;
  for (int64_t n = 0; n < N_; ++n) {
    for (int64_t t = cu_[n]; t < cu_[n + 1]; ++t) {
      const int32_t slot = static_cast<int32_t>(n);
      RecurrentKdaArgs a;
      a.o = {&o_rec[t * hk], DType::kF32};
      a.state = state.data();
      a.state_indices = &slot;
      a.num_states = N_;
      a.q = {&Tensor("q_conv")[t * hk], DType::kF32};
      a.k = {&Tensor("k_conv")[t * hk], DType::kF32};
      a.v = {&Tensor("v_conv")[t * hk], DType::kF32};
      a.g = {&Tensor("g")[t * hk], DType::kF32};
      a.beta = {&Tensor("beta")[t * H], DType::kF32};
      a.N = 1;
      a.H = H;
      a.K = K;
      a.V = K;
      a.options = opt;
      fused_recurrent_kda(a, KernelImpl::kReference);
    }
  }
  EXPECT_TRUE(AllCloseF32(o_rec.data(), Tensor("o_kda").data(), o_rec.size())) << "recurrent o";
  EXPECT_TRUE(AllCloseStateF32(state.data(), Tensor("final_recurrent_state").data(), state.size())) << "recurrent S";
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(AllCases()), CaseName);

}  // namespace
}  // namespace kda
