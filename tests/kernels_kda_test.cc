// Tests of the KDA kernels' API around the kernel matrix
// (kernels_kda_matrix_test.cc holds the numerics and state semantics): the
// scalar gate, argument validation of the reference and optimized kernels,
// the dispatcher (KDA_KERNEL / SetDefaultKernelImpl) and the ISA switch
// (KDA_ISA / SetKernelIsa).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/kernels/chunk_kda_reference.h"
#include "kda/kernels/fused_recurrent_kda_reference.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kda_gate.h"
#include "kda/kernels/kda_optimized.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/kda/kda_dispatch_testing.h"
#include "tests/error_util.h"
#include "tests/kda_problem.h"
#include "tests/kernel_matrix.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using kda::testing::AllCloseF32;

using testing::AllIsas;
using testing::ChunkArgsFor;
using testing::ChunkRun;
using testing::ExpectErrorContaining;
using testing::kSentinel;
using testing::MakeProblem;
using testing::Problem;
using testing::Result;
using testing::Spec;
using testing::SupportedIsas;
using testing::Typed;
using testing::TypedInputs;

// chunk_kda_reference over the whole packed batch. With `alias` the initial
// state buffer is also the final state buffer.
Result RunChunk(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32, bool alias = false) {
  ChunkRun run;
  run.qkv = qkv;
  run.gb = gb;
  run.alias = alias;
  return testing::RunChunkWith(p, &chunk_kda_reference, run);
}

// ------------------------------------------------- the scalar gate

TEST(KdaNumerics, KdaGateMatchesFormula) {
  for (float x : {-100.0F, -8.0F, -1.0F, 0.0F, 0.5F, 19.5F, 20.0F, 20.5F, 40.0F}) {
    for (float a_log : {0.0F, 1.0F, -2.0F}) {
      const double sp = x > 20 ? x : std::log1p(std::exp(static_cast<double>(x)));
      const double want = -std::exp(static_cast<double>(a_log)) * sp;
      const float got = KdaGate(x, a_log);
      EXPECT_LE(got, 0.0F);
      EXPECT_NEAR(got, want, 1e-6 + 1e-6 * std::fabs(want)) << "x=" << x << " a_log=" << a_log;
    }
  }
}

// ------------------------------------------------- validation

// A valid chunk_kda call (T = 4, N = 2, H = 2, K = V = 16) with sentinel outputs.
struct ChunkCall {
  std::vector<int64_t> cu = {0, 3, 4};
  std::vector<float> in = std::vector<float>(4 * 2 * 16, 0.1F);
  std::vector<float> gate = std::vector<float>(4 * 2 * 16, -0.1F);
  std::vector<float> beta = std::vector<float>(4 * 2, 0.5F);
  std::vector<float> h0 = std::vector<float>(2 * 2 * 16 * 16, 0.2F);
  std::vector<float> o = std::vector<float>(4 * 2 * 16, kSentinel);
  std::vector<float> final_state = std::vector<float>(2 * 2 * 16 * 16, kSentinel);
  ChunkKdaArgs args;  // points into the vectors above

  ChunkCall() {
    args.o = {o.data(), DType::kF32};
    args.final_state = final_state.data();
    args.q = args.k = args.v = {in.data(), DType::kF32};
    args.g = {gate.data(), DType::kF32};
    args.beta = {beta.data(), DType::kF32};
    args.cu_seqlens = cu.data();
    args.initial_state = h0.data();
    args.T = 4;
    args.N = 2;
    args.H = 2;
    args.K = args.V = 16;
  }
  ChunkCall(const ChunkCall&) = delete;
  ChunkCall& operator=(const ChunkCall&) = delete;
  bool Untouched() const {
    return std::all_of(o.begin(), o.end(), [](float x) { return x == kSentinel; }) &&
           std::all_of(final_state.begin(), final_state.end(), [](float x) { return x == kSentinel; });
  }
};

struct ChunkBadCase {
  const char* name;
  std::function<void(ChunkKdaArgs&)> mutate;
  const char* message;
};

TEST(KdaValidation, ChunkRejectsBadArgumentsWithoutWriting) {
  static const int64_t kCuFirst[] = {1, 3, 4};
  static const int64_t kCuDecreasing[] = {0, 5, 4};
  static const int64_t kCuShort[] = {0, 3, 3};
  static const float kALog[] = {0.0F, 0.0F};
  const std::vector<ChunkBadCase> cases = {
      {"null q", [](ChunkKdaArgs& a) { a.q.data = nullptr; }, "q is null"},
      {"null k", [](ChunkKdaArgs& a) { a.k.data = nullptr; }, "k is null"},
      {"null v", [](ChunkKdaArgs& a) { a.v.data = nullptr; }, "v is null"},
      {"null g", [](ChunkKdaArgs& a) { a.g.data = nullptr; }, "g is null"},
      {"null beta", [](ChunkKdaArgs& a) { a.beta.data = nullptr; }, "beta is null"},
      {"null o", [](ChunkKdaArgs& a) { a.o.data = nullptr; }, "o is null"},
      {"null cu_seqlens", [](ChunkKdaArgs& a) { a.cu_seqlens = nullptr; }, "cu_seqlens is null"},
      {"null final_state", [](ChunkKdaArgs& a) { a.final_state = nullptr; }, "output_final_state requires final_state"},
      {"q dtype", [](ChunkKdaArgs& a) { a.q.dtype = DType::kI32; }, "q dtype must be F32 or BF16"},
      {"k dtype", [](ChunkKdaArgs& a) { a.k.dtype = DType::kBF16; }, "k dtype BF16 differs from q dtype F32"},
      {"v dtype", [](ChunkKdaArgs& a) { a.v.dtype = DType::kBF16; }, "v dtype BF16 differs"},
      {"g dtype", [](ChunkKdaArgs& a) { a.g.dtype = DType::kI64; }, "g dtype must be F32 or BF16"},
      {"beta dtype", [](ChunkKdaArgs& a) { a.beta.dtype = DType::kI32; }, "beta dtype must be F32 or BF16"},
      {"o dtype", [](ChunkKdaArgs& a) { a.o.dtype = DType::kBF16; }, "o dtype BF16 differs from q dtype F32"},
      {"H = 0", [](ChunkKdaArgs& a) { a.H = 0; }, "H must be >= 1"},
      {"K != V", [](ChunkKdaArgs& a) { a.V = 32; }, "K (16) must equal V (32)"},
      {"K = 24", [](ChunkKdaArgs& a) { a.K = a.V = 24; }, "K must be a multiple of 16 in [16, 256], got 24"},
      {"K = 272", [](ChunkKdaArgs& a) { a.K = a.V = 272; }, "K must be a multiple of 16 in [16, 256], got 272"},
      {"K = 0", [](ChunkKdaArgs& a) { a.K = a.V = 0; }, "K must be a multiple of 16"},
      {"T < 0", [](ChunkKdaArgs& a) { a.T = -1; }, "T must be >= 0"},
      {"N = 0", [](ChunkKdaArgs& a) { a.N = 0; }, "N must be >= 1"},
      {"cu[0] != 0", [](ChunkKdaArgs& a) { a.cu_seqlens = kCuFirst; }, "cu_seqlens[0] must be 0"},
      {"cu decreasing", [](ChunkKdaArgs& a) { a.cu_seqlens = kCuDecreasing; }, "non-decreasing"},
      {"cu[N] != T", [](ChunkKdaArgs& a) { a.cu_seqlens = kCuShort; }, "cu_seqlens[N] must equal T"},
      {"gate without A_log", [](ChunkKdaArgs& a) { a.options.use_gate_in_kernel = true; },
       "use_gate_in_kernel requires A_log"},
      {"nan scale", [](ChunkKdaArgs& a) { a.options.scale = std::nanf(""); }, "scale must be finite"},
      {"shifted alias", [](ChunkKdaArgs& a) { a.initial_state = a.final_state + 1; }, "overlap"},
  };
  for (const ChunkBadCase& c : cases) {
    SCOPED_TRACE(c.name);
    for (bool dispatch : {false, true}) {
      ChunkCall call;
      c.mutate(call.args);
      ExpectErrorContaining(
          [&] {
            if (dispatch) {
              chunk_kda(call.args);
            } else {
              chunk_kda_reference(call.args);
            }
          },
          c.message);
      EXPECT_TRUE(call.Untouched());
    }
  }
  // The unmutated call and the valid variants are accepted.
  ChunkCall ok;
  EXPECT_NO_THROW(chunk_kda_reference(ok.args));
  ChunkCall gated;
  gated.args.options.use_gate_in_kernel = true;
  gated.args.options.A_log = kALog;
  EXPECT_NO_THROW(chunk_kda_reference(gated.args));
}

// ChunkCall in the pool form: sequences 0 and 1 in slots 1 and 3 of a 4-slot pool.
struct ChunkPoolCall : ChunkCall {
  std::vector<int32_t> idx = {1, 3};
  std::vector<float> pool = std::vector<float>(4 * 2 * 16 * 16, kSentinel);

  ChunkPoolCall() {
    args.initial_state = nullptr;
    args.final_state = nullptr;
    args.state = pool.data();
    args.state_indices = idx.data();
    args.num_states = 4;
  }
  bool Untouched() const {
    return ChunkCall::Untouched() && std::all_of(pool.begin(), pool.end(), [](float x) { return x == kSentinel; });
  }
};

TEST(KdaValidation, ChunkPoolFormRejectsBadIndicesWithoutWriting) {
  static const int32_t kOutOfRange[] = {1, 4};
  static const int32_t kDuplicate[] = {2, 2};
  static const float kState[2 * 2 * 16 * 16] = {};
  static float scratch[2 * 2 * 16 * 16];
  const std::vector<ChunkBadCase> cases = {
      {"index out of range", [](ChunkKdaArgs& a) { a.state_indices = kOutOfRange; },
       "state_indices[1] = 4 is out of range for num_states = 4"},
      {"duplicate index", [](ChunkKdaArgs& a) { a.state_indices = kDuplicate; },
       "duplicate state index 2 in state_indices[0] and state_indices[1]"},
      {"null state", [](ChunkKdaArgs& a) { a.state = nullptr; }, "state_indices given but state is null"},
      {"negative num_states", [](ChunkKdaArgs& a) { a.num_states = -1; }, "num_states must be >= 0"},
      {"also initial_state", [](ChunkKdaArgs& a) { a.initial_state = kState; },
       "excludes initial_state and final_state"},
      {"also final_state", [](ChunkKdaArgs& a) { a.final_state = scratch; }, "excludes initial_state and final_state"},
      {"state without indices", [](ChunkKdaArgs& a) { a.state_indices = nullptr; },
       "state (pool form) requires state_indices"},
  };
  for (const ChunkBadCase& c : cases) {
    SCOPED_TRACE(c.name);
    for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
      ChunkPoolCall call;
      c.mutate(call.args);
      ExpectErrorContaining([&] { chunk_kda(call.args, impl); }, c.message);
      EXPECT_TRUE(call.Untouched());
    }
  }
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    ChunkPoolCall ok;
    EXPECT_NO_THROW(chunk_kda(ok.args, impl));
    EXPECT_FALSE(ok.Untouched());
  }
}

// A valid fused_recurrent_kda call (N = 3, H = 2, K = V = 16, 4 states) with sentinel outputs.
struct RecurrentCall {
  std::vector<int32_t> idx = {1, -1, 3};
  std::vector<float> in = std::vector<float>(3 * 2 * 16, 0.1F);
  std::vector<float> gate = std::vector<float>(3 * 2 * 16, -0.1F);
  std::vector<float> beta = std::vector<float>(3 * 2, 0.5F);
  std::vector<float> state = std::vector<float>(4 * 2 * 16 * 16, kSentinel);
  std::vector<float> o = std::vector<float>(3 * 2 * 16, kSentinel);
  RecurrentKdaArgs args;  // points into the vectors above

  RecurrentCall() {
    args.o = {o.data(), DType::kF32};
    args.state = state.data();
    args.state_indices = idx.data();
    args.num_states = 4;
    args.q = args.k = args.v = {in.data(), DType::kF32};
    args.g = {gate.data(), DType::kF32};
    args.beta = {beta.data(), DType::kF32};
    args.N = 3;
    args.H = 2;
    args.K = args.V = 16;
  }
  RecurrentCall(const RecurrentCall&) = delete;
  RecurrentCall& operator=(const RecurrentCall&) = delete;
  bool Untouched() const {
    return std::all_of(o.begin(), o.end(), [](float x) { return x == kSentinel; }) &&
           std::all_of(state.begin(), state.end(), [](float x) { return x == kSentinel; });
  }
};

struct RecurrentBadCase {
  const char* name;
  std::function<void(RecurrentKdaArgs&)> mutate;
  const char* message;
};

TEST(KdaValidation, RecurrentRejectsBadArgumentsWithoutWriting) {
  static const int32_t kOutOfRange[] = {1, -1, 4};
  static const int32_t kDuplicate[] = {3, -1, 3};
  const std::vector<RecurrentBadCase> cases = {
      {"null q", [](RecurrentKdaArgs& a) { a.q.data = nullptr; }, "q is null"},
      {"null g", [](RecurrentKdaArgs& a) { a.g.data = nullptr; }, "g is null"},
      {"null beta", [](RecurrentKdaArgs& a) { a.beta.data = nullptr; }, "beta is null"},
      {"null o", [](RecurrentKdaArgs& a) { a.o.data = nullptr; }, "o is null"},
      {"null state", [](RecurrentKdaArgs& a) { a.state = nullptr; }, "state is null"},
      {"null indices", [](RecurrentKdaArgs& a) { a.state_indices = nullptr; }, "state_indices is null"},
      {"q dtype", [](RecurrentKdaArgs& a) { a.q.dtype = DType::kI64; }, "q dtype must be F32 or BF16"},
      {"v dtype", [](RecurrentKdaArgs& a) { a.v.dtype = DType::kBF16; }, "v dtype BF16 differs"},
      {"o dtype", [](RecurrentKdaArgs& a) { a.o.dtype = DType::kBF16; }, "o dtype BF16 differs"},
      {"H = 0", [](RecurrentKdaArgs& a) { a.H = 0; }, "H must be >= 1"},
      {"K != V", [](RecurrentKdaArgs& a) { a.V = 32; }, "must equal V"},
      {"K = 8", [](RecurrentKdaArgs& a) { a.K = a.V = 8; }, "K must be a multiple of 16"},
      {"N < 0", [](RecurrentKdaArgs& a) { a.N = -1; }, "N must be >= 0"},
      {"num_states < 0", [](RecurrentKdaArgs& a) { a.num_states = -1; }, "num_states must be >= 0"},
      {"index out of range", [](RecurrentKdaArgs& a) { a.state_indices = kOutOfRange; },
       "state_indices[2] = 4 is out of range"},
      {"duplicate index", [](RecurrentKdaArgs& a) { a.state_indices = kDuplicate; }, "duplicate state index 3"},
      {"gate without A_log", [](RecurrentKdaArgs& a) { a.options.use_gate_in_kernel = true; },
       "use_gate_in_kernel requires A_log"},
  };
  for (const RecurrentBadCase& c : cases) {
    SCOPED_TRACE(c.name);
    for (bool dispatch : {false, true}) {
      RecurrentCall call;
      c.mutate(call.args);
      ExpectErrorContaining(
          [&] {
            if (dispatch) {
              fused_recurrent_kda(call.args);
            } else {
              fused_recurrent_kda_reference(call.args);
            }
          },
          c.message);
      EXPECT_TRUE(call.Untouched());
    }
  }
  RecurrentCall ok;
  EXPECT_NO_THROW(fused_recurrent_kda_reference(ok.args));
  RecurrentCall empty;  // an empty batch needs no buffers
  empty.args = RecurrentKdaArgs{};
  empty.args.H = 1;
  empty.args.K = empty.args.V = 16;
  EXPECT_NO_THROW(fused_recurrent_kda_reference(empty.args));
}

// ------------------------------------------------- dispatcher

// Restores KDA_KERNEL and the dispatcher defaults when a test ends.
class KdaDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("KDA_KERNEL");
    if (env != nullptr) saved_env_ = env;
  }
  void TearDown() override {
    if (saved_env_) {
      setenv("KDA_KERNEL", saved_env_->c_str(), 1);
    } else {
      unsetenv("KDA_KERNEL");
    }
    internal::ResetDefaultKernelImplForTesting();
  }
  static void UseEnv(const char* value) {
    setenv("KDA_KERNEL", value, 1);
    internal::ResetDefaultKernelImplForTesting();
  }

 private:
  std::optional<std::string> saved_env_;
};

TEST_F(KdaDispatchTest, ParsesNames) {
  for (KernelImpl impl : {KernelImpl::kAuto, KernelImpl::kReference, KernelImpl::kOptimized}) {
    EXPECT_EQ(ParseKernelImpl(KernelImplName(impl)), impl);
  }
  ExpectErrorContaining([] { ParseKernelImpl("fast"); },
                        "unknown kernel 'fast' (expected auto, reference or optimized)");
  ExpectErrorContaining([] { ParseKernelImpl(""); }, "unknown kernel ''");
  ExpectErrorContaining([] { ParseKernelImpl("Reference"); }, "unknown kernel 'Reference'");
}

TEST_F(KdaDispatchTest, ResolvesAutoToOptimized) {
  UseEnv("");
  EXPECT_EQ(DefaultKernelImpl(), KernelImpl::kAuto);
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kAuto), KernelImpl::kOptimized);
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kReference), KernelImpl::kReference);
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kOptimized), KernelImpl::kOptimized);
  EXPECT_STREQ(ActiveKernelDescription(KernelImpl::kReference), "reference");
  EXPECT_EQ(std::string(ActiveKernelDescription(KernelImpl::kOptimized)),
            std::string("optimized/") + KernelIsaName(ActiveKernelIsa()));

  SetDefaultKernelImpl(KernelImpl::kReference);
  EXPECT_EQ(DefaultKernelImpl(), KernelImpl::kReference);
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kAuto), KernelImpl::kReference);
  EXPECT_STREQ(ActiveKernelDescription(), "reference");
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kOptimized), KernelImpl::kOptimized);  // an explicit request wins

  SetDefaultKernelImpl(KernelImpl::kOptimized);
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kAuto), KernelImpl::kOptimized);
}

TEST_F(KdaDispatchTest, EnvironmentVariableSetsDefault) {
  UseEnv("reference");
  EXPECT_EQ(DefaultKernelImpl(), KernelImpl::kReference);
  setenv("KDA_KERNEL", "optimized", 1);  // parsed once: a later change is not seen
  EXPECT_EQ(DefaultKernelImpl(), KernelImpl::kReference);

  UseEnv("optimized");
  EXPECT_EQ(DefaultKernelImpl(), KernelImpl::kOptimized);
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kAuto), KernelImpl::kOptimized);
  SetDefaultKernelImpl(KernelImpl::kReference);  // SetDefaultKernelImpl overrides the environment
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kAuto), KernelImpl::kReference);

  UseEnv("turbo");  // a bad value is an Error when the default is needed, not an abort
  ExpectErrorContaining([] { DefaultKernelImpl(); }, "KDA_KERNEL");
  ExpectErrorContaining([] { ResolveKernelImpl(KernelImpl::kAuto); }, "unknown kernel 'turbo'");
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kReference), KernelImpl::kReference);
  SetDefaultKernelImpl(KernelImpl::kReference);
  EXPECT_EQ(DefaultKernelImpl(), KernelImpl::kReference);
}

TEST_F(KdaDispatchTest, EntryPointsRunTheRequestedKernel) {
  UseEnv("");
  Spec s;
  s.lengths = {2, 70};
  s.H = 2;
  s.K = 16;
  s.seed = 101;
  const Problem p = MakeProblem(s);
  const Result want = RunChunk(p);
  const TypedInputs in(p, DType::kF32, DType::kF32);
  Typed o(p.q.size(), DType::kF32, kSentinel);
  std::vector<float> final_state(p.StateSize(), kSentinel);
  ChunkKdaArgs a = ChunkArgsFor(p, in, o.Mut());
  a.final_state = final_state.data();
  a.initial_state = p.h0.data();
  chunk_kda(a, KernelImpl::kReference);
  EXPECT_EQ(o.ToF32(), want.o);
  EXPECT_EQ(final_state, want.state);
  // Auto runs the optimized kernel: equal to the reference within the fp32 tolerance.
  chunk_kda(a);
  EXPECT_TRUE(AllCloseF32(o.ToF32().data(), want.o.data(), want.o.size()));
  EXPECT_TRUE(AllCloseF32(final_state.data(), want.state.data(), want.state.size()));

  // One decode step through the dispatcher equals the reference.
  RecurrentCall r1, r2, r3;
  for (size_t i = 0; i < r1.state.size(); ++i) {
    r1.state[i] = r2.state[i] = r3.state[i] = 0.01F * static_cast<float>(i % 97);
  }
  fused_recurrent_kda(r1.args, KernelImpl::kReference);
  fused_recurrent_kda_reference(r2.args);
  EXPECT_EQ(r1.o, r2.o);
  EXPECT_EQ(r1.state, r2.state);
  fused_recurrent_kda(r3.args);
  EXPECT_TRUE(AllCloseF32(r3.o.data(), r2.o.data(), r2.o.size()));
  EXPECT_TRUE(AllCloseF32(r3.state.data(), r2.state.data(), r2.state.size()));
}

// ------------------------------------------------- optimized validation

TEST(KdaValidation, OptimizedKernelsValidateBeforeWriting) {
  Spec s;
  s.lengths = {3, 2};
  s.H = 1;
  s.K = 16;
  const Problem p = MakeProblem(s);
  const Typed q(p.q, DType::kF32), g(p.g, DType::kF32), beta(p.beta, DType::kF32);
  std::vector<float> o(p.q.size(), kSentinel);
  std::vector<float> final_state(p.StateSize(), kSentinel);
  ChunkKdaArgs a;
  a.o = {o.data(), DType::kF32};
  a.final_state = final_state.data();
  a.q = a.k = a.v = q.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.T = p.T;
  a.N = p.N;
  a.H = 1;
  a.K = a.V = 24;
  ExpectErrorContaining([&] { chunk_kda_optimized(a); }, "K must be a multiple of 16");
  a.K = a.V = 16;
  a.v.dtype = DType::kBF16;
  ExpectErrorContaining([&] { chunk_kda_optimized(a); }, "v dtype BF16 differs");
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == kSentinel; }));
  EXPECT_TRUE(std::all_of(final_state.begin(), final_state.end(), [](float x) { return x == kSentinel; }));

  const int32_t dup[] = {1, 1};
  std::vector<float> states(2 * 16 * 16, kSentinel);
  RecurrentKdaArgs r;
  r.o = {o.data(), DType::kF32};
  r.state = states.data();
  r.state_indices = dup;
  r.num_states = 2;
  r.q = r.k = r.v = q.Const();
  r.g = g.Const();
  r.beta = beta.Const();
  r.N = 2;
  r.H = 1;
  r.K = r.V = 16;
  ExpectErrorContaining([&] { fused_recurrent_kda_optimized(r); }, "duplicate state index 1");
  EXPECT_TRUE(std::all_of(states.begin(), states.end(), [](float x) { return x == kSentinel; }));
  r.N = 0;  // an empty batch needs no buffers
  r.state = nullptr;
  EXPECT_NO_THROW(fused_recurrent_kda_optimized(r));
}

// ------------------------------------------------- ISA switch

// Restores KDA_ISA and the forced ISA when a test ends.
class KdaIsaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("KDA_ISA");
    if (env != nullptr) saved_env_ = env;
  }
  void TearDown() override {
    if (saved_env_) {
      setenv("KDA_ISA", saved_env_->c_str(), 1);
    } else {
      unsetenv("KDA_ISA");
    }
    internal::ResetKernelIsaForTesting();
  }

 private:
  std::optional<std::string> saved_env_;
};

TEST_F(KdaIsaTest, NamesAndSupport) {
  EXPECT_EQ(ParseKernelIsa(KernelIsaName(KernelIsa::kAuto)), KernelIsa::kAuto);
  for (KernelIsa isa : AllIsas()) EXPECT_EQ(ParseKernelIsa(KernelIsaName(isa)), isa);
  ExpectErrorContaining([] { ParseKernelIsa("sse"); },
                        "unknown kernel ISA 'sse' (expected auto, generic, avx2, avx512 or avx512_shape)");
  EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kGeneric));
  EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kAuto));
  EXPECT_NE(BestKernelIsa(), KernelIsa::kAuto);
  EXPECT_TRUE(CpuSupportsKernelIsa(BestKernelIsa()));
  if (CpuSupportsKernelIsa(KernelIsa::kAvx512)) {
    EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kAvx2));
  }
  // The test variant runs wherever AVX2 does, and is never the best.
  EXPECT_EQ(CpuSupportsKernelIsa(KernelIsa::kAvx512Shape), CpuSupportsKernelIsa(KernelIsa::kAvx2));
  EXPECT_NE(BestKernelIsa(), KernelIsa::kAvx512Shape);
}

TEST_F(KdaIsaTest, OverrideThroughApiAndEnvironment) {
  unsetenv("KDA_ISA");
  internal::ResetKernelIsaForTesting();
  EXPECT_EQ(ActiveKernelIsa(), BestKernelIsa());
  for (KernelIsa isa : SupportedIsas()) {
    SetKernelIsa(isa);
    EXPECT_EQ(ActiveKernelIsa(), isa);
    EXPECT_EQ(std::string(ActiveKernelDescription(KernelImpl::kOptimized)),
              std::string("optimized/") + KernelIsaName(isa));
  }
  SetKernelIsa(KernelIsa::kAuto);
  EXPECT_EQ(ActiveKernelIsa(), BestKernelIsa());
  for (KernelIsa isa : AllIsas()) {
    if (CpuSupportsKernelIsa(isa)) continue;
    ExpectErrorContaining([isa] { SetKernelIsa(isa); }, "is not supported by this");
  }

  setenv("KDA_ISA", "generic", 1);
  internal::ResetKernelIsaForTesting();
  EXPECT_EQ(ActiveKernelIsa(), KernelIsa::kGeneric);
  setenv("KDA_ISA", "auto", 1);  // parsed once: a later change is not seen
  EXPECT_EQ(ActiveKernelIsa(), KernelIsa::kGeneric);
  SetKernelIsa(BestKernelIsa());  // the API overrides the environment
  EXPECT_EQ(ActiveKernelIsa(), BestKernelIsa());

  setenv("KDA_ISA", "avx1024", 1);  // a bad value is an Error when needed, not an abort
  internal::ResetKernelIsaForTesting();
  ExpectErrorContaining([] { ActiveKernelIsa(); }, "KDA_ISA environment variable: unknown kernel ISA 'avx1024'");
  ExpectErrorContaining([] { ResolveKernelImpl(KernelImpl::kOptimized); }, "KDA_ISA");
  Spec s;
  s.lengths = {4};
  s.H = 1;
  s.K = 16;
  const Problem p = MakeProblem(s);
  ExpectErrorContaining([&] { testing::RunChunkWith(p, &chunk_kda_optimized); }, "KDA_ISA");
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kReference), KernelImpl::kReference);
  for (KernelIsa isa : AllIsas()) {
    if (CpuSupportsKernelIsa(isa)) continue;
    setenv("KDA_ISA", KernelIsaName(isa), 1);
    internal::ResetKernelIsaForTesting();
    ExpectErrorContaining([] { ActiveKernelIsa(); }, "is not supported by this");
  }
}

}  // namespace
}  // namespace kda
