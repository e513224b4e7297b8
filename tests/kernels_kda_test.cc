// Tests of the KDA kernels' API around the kernel matrix
// (kernels_kda_matrix_test.cc holds the numerics and state semantics): the
// scalar gate, the checks of the kernel calls (ChunkKdaCall, RecurrentKdaCall:
// the shape check, the bind, the reference and optimized kernels behind it;
// what each refuses, with which message, writing nothing, and the equivalent
// forms each accepts), the dispatcher (KDA_KERNEL / SetDefaultKernelImpl) and
// the ISA switch (KDA_ISA / SetKernelIsa).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
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
using testing::ChunkCallFor;
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

// The entry points of one kernel, so that the tests below run either kernel's calls alike.
void BindCall(const ChunkKdaCall& c) { BindChunkKda(c); }
void BindCall(const RecurrentKdaCall& c) { BindRecurrentKda(c); }
void RunCall(const ChunkKdaCall& c, KernelImpl impl) { chunk_kda(c, impl); }
void RunCall(const RecurrentKdaCall& c, KernelImpl impl) { fused_recurrent_kda(c, impl); }
KdaCallShapes ShapesOf(const ChunkKdaCall& c) { return CheckChunkKdaShapes(c); }
KdaCallShapes ShapesOf(const RecurrentKdaCall& c) { return CheckRecurrentKdaShapes(c); }

// Token buffers large enough for every shape a case below claims (a refusal
// reads none of them, but a wrongly accepted call must not read past them).
constexpr size_t kTokenRoom = 4 * 4 * 272;
constexpr size_t kStateElems = 2 * 16 * 16;  // one [H, K, V] state

bool AllSentinel(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float e) { return e == kSentinel; });
}

// Sets dimension `dim` (0 B, 1 T, 2 H) of every token view (q, k, v, g, beta, o) to n.
template <class Call>
void SetTokenDim(Call& c, int dim, int64_t n) {
  for (TensorView* v : {&c.q, &c.k, &c.v, &c.g, &c.beta}) v->shape[dim] = n;
  c.o.shape[dim] = n;
}

// Sets the value heads of v, g, beta and o.
template <class Call>
void SetValueHeads(Call& c, int64_t hv) {
  c.v.shape[2] = c.g.shape[2] = c.beta.shape[2] = c.o.shape[2] = hv;
}

// Sets the key dim of q, k, g and the value dim of v, o.
template <class Call>
void SetHeadDims(Call& c, int64_t k_dim, int64_t v_dim) {
  c.q.shape[3] = c.k.shape[3] = c.g.shape[3] = k_dim;
  c.v.shape[3] = c.o.shape[3] = v_dim;
}

// Gives a view explicit strides (in elements).
template <class V>
void SetStrides(V& v, std::initializer_list<int64_t> strides) {
  v.strided = true;
  std::copy(strides.begin(), strides.end(), v.strides);
}

// Gives a C-contiguous view a gap: explicit strides, those of dimensions up
// to `dim` doubled (so that `dim` is the first dimension, from the last, out of step).
template <class V>
void AddGap(V& v, int dim) {
  v.strided = true;
  int64_t stride = 1;
  for (int i = v.ndim; i-- > 0;) {
    v.strides[i] = i <= dim ? 2 * stride : stride;
    stride *= v.shape[i];
  }
}

// Gives a [B, T, heads, dim] token view the strides of a fused projection's
// slice: [T * s, s, dim, 1] (s elements from one token to the next).
template <class V>
void SetTokenStride(V& v, int64_t s) {
  SetStrides(v, {v.shape[1] * s, s, v.shape[3], 1});
}

// A valid chunk_kda call (T = 4 packed tokens of N = 2 sequences, H = 2,
// K = V = 16, contiguous states) with sentinel outputs.
struct ChunkFixture {
  std::vector<int64_t> cu = {0, 3, 4};
  std::vector<float> in = std::vector<float>(kTokenRoom, 0.1F);
  std::vector<float> gate = std::vector<float>(kTokenRoom, -0.1F);
  std::vector<float> beta = std::vector<float>(kTokenRoom, 0.5F);
  std::vector<float> h0 = std::vector<float>(2 * kStateElems, 0.2F);
  std::vector<float> o = std::vector<float>(kTokenRoom, kSentinel);
  std::vector<float> final_state = std::vector<float>(2 * kStateElems, kSentinel);
  ChunkKdaCall call;  // views of the vectors above

  ChunkFixture() {
    call.o = ContiguousView<void*>(o.data(), DType::kF32, {1, 4, 2, 16});
    call.final_state = ContiguousView<void*>(final_state.data(), DType::kF32, {2, 2, 16, 16});
    call.q = call.k = call.v = ContiguousView<const void*>(in.data(), DType::kF32, {1, 4, 2, 16});
    call.g = ContiguousView<const void*>(gate.data(), DType::kF32, {1, 4, 2, 16});
    call.beta = ContiguousView<const void*>(beta.data(), DType::kF32, {1, 4, 2});
    call.initial_state = ContiguousView<const void*>(h0.data(), DType::kF32, {2, 2, 16, 16});
    call.output_final_state = true;
    call.cu_seqlens = ContiguousView<const void*>(cu.data(), DType::kI64, {3});
  }
  ChunkFixture(const ChunkFixture&) = delete;
  ChunkFixture& operator=(const ChunkFixture&) = delete;
  bool Untouched() const { return AllSentinel(o) && AllSentinel(final_state); }
};

// ChunkFixture in the pool form: sequences 0 and 1 in slots 1 and 3 of a 4-slot pool.
struct ChunkPoolFixture : ChunkFixture {
  std::vector<int32_t> idx = {1, 3};
  std::vector<uint8_t> has_init = {1, 0};
  std::vector<float> pool = std::vector<float>(4 * kStateElems, kSentinel);

  ChunkPoolFixture() {
    call.initial_state = {};
    call.final_state = {};
    call.output_final_state = false;
    call.state = ContiguousView<void*>(pool.data(), DType::kF32, {4, 2, 16, 16});
    call.state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {2});
    call.has_initial_state = ContiguousView<const void*>(has_init.data(), DType::kU8, {2});
  }
  bool Untouched() const { return ChunkFixture::Untouched() && AllSentinel(pool); }
};

// A valid fused_recurrent_kda call (N = 3 tokens [3, 1, 2, 16], a pool of 4
// states, entry 1 padding) with sentinel outputs.
struct RecurrentFixture {
  std::vector<int32_t> idx = {1, -1, 3};
  std::vector<float> in = std::vector<float>(kTokenRoom, 0.1F);
  std::vector<float> gate = std::vector<float>(kTokenRoom, -0.1F);
  std::vector<float> beta = std::vector<float>(kTokenRoom, 0.5F);
  std::vector<float> state = std::vector<float>(4 * kStateElems, kSentinel);
  std::vector<float> o = std::vector<float>(kTokenRoom, kSentinel);
  RecurrentKdaCall call;  // views of the vectors above

  RecurrentFixture() {
    call.o = ContiguousView<void*>(o.data(), DType::kF32, {3, 1, 2, 16});
    call.q = call.k = call.v = ContiguousView<const void*>(in.data(), DType::kF32, {3, 1, 2, 16});
    call.g = ContiguousView<const void*>(gate.data(), DType::kF32, {3, 1, 2, 16});
    call.beta = ContiguousView<const void*>(beta.data(), DType::kF32, {3, 1, 2});
    call.initial_state = ContiguousView<void*>(state.data(), DType::kF32, {4, 2, 16, 16});
    call.ssm_state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {3});
  }
  RecurrentFixture(const RecurrentFixture&) = delete;
  RecurrentFixture& operator=(const RecurrentFixture&) = delete;
  bool Untouched() const { return AllSentinel(o) && AllSentinel(state); }
};

// The fixture's three decode tokens as one packed row [1, 3, H, K].
void PackTokens(RecurrentKdaCall& c) {
  SetTokenDim(c, 0, 1);
  SetTokenDim(c, 1, 3);
}

// Which checks refuse a bad call. A call's views (shapes, dtypes, layouts,
// options) and the values of its index tensors are refused by the shape
// check too; missing data and the rest of the values only by a bind.
enum class Refusal {
  kShape,  // the shape check and the bind, as kda::Error but not DTypeError
  kDType,  // the shape check and the bind, as DTypeError
  kBind,   // the bind only: the shape check accepts the call
};

template <class Call>
struct BadCase {
  const char* name;
  std::function<void(Call&)> mutate;
  const char* message;
  Refusal refusal = Refusal::kShape;
  const char* shape_message = nullptr;  // the shape check's, where it differs from the bind's
};

// What every refusal of a kernel's calls starts with: the name of the call's entry.
const char* Who(const ChunkKdaCall& c) {
  return c.entry == DeltaRuleEntry::kGatedDeltaRule ? "chunk_gated_delta_rule: " : "chunk_kda: ";
}
const char* Who(const RecurrentKdaCall& c) {
  return c.entry == DeltaRuleEntry::kGatedDeltaRule ? "fused_recurrent_gated_delta_rule: " : "fused_recurrent_kda: ";
}

// Expects fn to throw a kda::Error that starts with `who` and contains
// `what`, a DTypeError exactly when `dtype`.
void ExpectRefused(const std::function<void()>& fn, const std::string& who, const std::string& what, bool dtype) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected one containing '" << what << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(who, 0), 0U) << "message: " << message;
    EXPECT_NE(message.find(what), std::string::npos) << "message: " << message;
    EXPECT_EQ(dynamic_cast<const DTypeError*>(&e) != nullptr, dtype) << "DTypeError? message: " << message;
  }
}

// Each case's call, mutated from a valid Fixture, is refused by the bind and
// both implementations (and by the shape check unless Refusal::kBind) with
// its message, and writes nothing.
template <class Fixture, class Call>
void ExpectCasesRefused(const std::vector<BadCase<Call>>& cases) {
  for (const BadCase<Call>& c : cases) {
    SCOPED_TRACE(c.name);
    Fixture f;
    c.mutate(f.call);
    const char* who = Who(f.call);
    const bool dtype = c.refusal == Refusal::kDType;
    ExpectRefused([&] { BindCall(f.call); }, who, c.message, dtype);
    for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
      ExpectRefused([&] { RunCall(f.call, impl); }, who, c.message, dtype);
    }
    if (c.refusal == Refusal::kBind) {
      EXPECT_NO_THROW(ShapesOf(f.call));
    } else {
      ExpectRefused([&] { ShapesOf(f.call); }, who, c.shape_message != nullptr ? c.shape_message : c.message, dtype);
    }
    EXPECT_TRUE(f.Untouched());
  }
}

// Refusals of the token operands and the options, alike in both kernels'
// fixtures (H = 2, K = V = 16; the messages leave out the B and T dimensions).
template <class C>
std::vector<BadCase<C>> TokenCases() {
  static const float kALog[] = {0.0F, 0.0F, 0.0F};
  const Refusal kBind = Refusal::kBind;
  const Refusal kDType = Refusal::kDType;
  return {
      // Data: a view with elements needs them; the output is required.
      {"null q", [](C& c) { c.q.data = nullptr; }, "q is null", kBind},
      {"null k", [](C& c) { c.k.data = nullptr; }, "k is null", kBind},
      {"null v", [](C& c) { c.v.data = nullptr; }, "v is null", kBind},
      {"null g", [](C& c) { c.g.data = nullptr; }, "g is null", kBind},
      {"null beta", [](C& c) { c.beta.data = nullptr; }, "beta is null", kBind},
      {"null o", [](C& c) { c.o.data = nullptr; }, "o is null", kBind},
      {"absent o", [](C& c) { c.o = {}; }, "o: required (the output [B, T, HV, V])", kBind},
      // Shapes.
      {"q 3-D", [](C& c) { c.q.ndim = 3; }, "q: expected a 4-D array [B, T, H, K], got shape"},
      {"v 5-D", [](C& c) { c.v.ndim = 5; }, "v: expected a 4-D array [B, T, HV, V], got shape"},
      {"k shape", [](C& c) { c.k.shape[3] = 32; }, "k: expected shape [B, T, H, K] (q's shape) ="},
      {"v shape", [](C& c) { c.v.shape[0] = 2; }, "v: expected shape [B, T, HV, V] (B, T of q) ="},
      {"HV = 3 with H = 2", [](C& c) { SetValueHeads(c, 3); },
       "v: the value heads HV = 3 must be a multiple of the query/key heads H = 2 (grouped value heads)"},
      {"g shape", [](C& c) { c.g.shape[3] = 8; },
       "g: expected shape [B, T, HV, K] (HV of v, K of q; [B, T, HV]: a gate per value head) ="},
      {"scalar g shape",
       [](C& c) {
         c.g.ndim = 3;
         c.g.shape[2] = 3;
       },
       "g: expected shape [B, T, HV] (HV of v: a gate per value head; [B, T, HV, K]: one per key dimension) ="},
      {"beta shape", [](C& c) { c.beta.shape[2] = 3; }, "beta: expected shape [B, T, HV]"},
      {"o shape", [](C& c) { c.o.shape[3] = 32; }, "o: expected shape [B, T, HV, V] ="},
      {"H = 0", [](C& c) { SetTokenDim(c, 2, 0); }, "H must be >= 1, got 0"},
      {"K = 272", [](C& c) { SetHeadDims(c, 272, 16); }, "q: the key head dim K must be in [1, 256], got 272"},
      {"K = 0", [](C& c) { SetHeadDims(c, 0, 16); }, "q: the key head dim K must be in [1, 256], got 0"},
      {"V = 300", [](C& c) { SetHeadDims(c, 16, 300); }, "v: the value head dim V must be in [1, 256], got 300"},
      {"V = 0", [](C& c) { SetHeadDims(c, 16, 0); }, "v: the value head dim V must be in [1, 256], got 0"},
      // Layouts.
      {"q with a gap", [](C& c) { AddGap(c.q, 2); }, "q: must be C-contiguous or a token-strided slice"},
      {"k heads transposed",
       [](C& c) {
         SetStrides(c.k, {c.k.shape[1] * 32, 32, 1, 2});
       },
       "k: must be C-contiguous or a token-strided slice [B, T, heads, dim] with strides [T * s, s, dim, 1]"},
      {"v tokens overlapping", [](C& c) { SetTokenStride(c.v, 16); },
       "v: must be C-contiguous or a token-strided slice"},
      {"q tokens backwards", [](C& c) { SetTokenStride(c.q, -32); }, "q: must be C-contiguous or a token-strided"},
      // g and beta are read as contiguous rows only.
      {"g token-strided", [](C& c) { SetTokenStride(c.g, 40); }, "g: must be C-contiguous (row-major, no gaps)"},
      {"beta token-strided",
       [](C& c) {
         SetStrides(c.beta, {c.beta.shape[1] * 3, 3, 1});
       },
       "beta: must be C-contiguous (row-major, no gaps)"},
      {"g with a gap", [](C& c) { AddGap(c.g, 3); }, "g: must be C-contiguous (row-major, no gaps); shape"},
      {"beta with a gap", [](C& c) { AddGap(c.beta, 2); }, "beta: must be C-contiguous"},
      {"o with a gap", [](C& c) { AddGap(c.o, 3); }, "o: must be C-contiguous"},
      // Dtypes.
      {"q int32", [](C& c) { c.q.dtype = DType::kI32; }, "q: dtype must be float32, bfloat16 or float16, got int32",
       kDType},
      {"q float64", [](C& c) { c.q.foreign_dtype = "float64"; },
       "q: dtype must be float32, bfloat16 or float16, got float64", kDType},
      {"k int32", [](C& c) { c.k.dtype = DType::kI32; }, "k: dtype must be float32, bfloat16 or float16, got int32",
       kDType},
      {"v float64", [](C& c) { c.v.foreign_dtype = "float64"; },
       "v: dtype must be float32, bfloat16 or float16, got float64", kDType},
      {"g int64", [](C& c) { c.g.dtype = DType::kI64; }, "g: dtype must be float32, bfloat16 or float16, got int64",
       kDType},
      {"g float64", [](C& c) { c.g.foreign_dtype = "float64"; },
       "g: dtype must be float32, bfloat16 or float16, got float64", kDType},
      {"beta int32", [](C& c) { c.beta.dtype = DType::kI32; },
       "beta: dtype must be float32, bfloat16 or float16, got int32", kDType},
      {"beta uint8", [](C& c) { c.beta.dtype = DType::kU8; },
       "beta: dtype must be float32, bfloat16 or float16, got uint8", kDType},
      // fla's dtype of o: q's for chunk_kda, v's for fused_recurrent_kda (the same here).
      {"o bfloat16", [](C& c) { c.o.dtype = DType::kBF16; }, "'s (float32), got bfloat16", kDType},
      {"o float64", [](C& c) { c.o.foreign_dtype = "float64"; }, "'s (float32), got float64", kDType},
      // Options.
      {"nan scale", [](C& c) { c.scale = std::nanf(""); }, "scale: must be a finite number > 0"},
      {"infinite scale", [](C& c) { c.scale = INFINITY; }, "scale: must be a finite number > 0"},
      {"zero scale", [](C& c) { c.scale = 0.0F; }, "scale: must be a finite number > 0"},
      {"negative scale", [](C& c) { c.scale = -0.25F; }, "scale: must be a finite number > 0"},
      {"gate without A_log", [](C& c) { c.use_gate_in_kernel = true; },
       "A_log: required with use_gate_in_kernel=True when lower_bound is not set (shape [HV])"},
      {"allow_neg_eigval alone", [](C& c) { c.allow_neg_eigval = true; },
       "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"},
      {"positive lower_bound", [](C& c) { c.lower_bound = 0.5F; },
       "lower_bound: must be a finite number <= 0 (a log decay bound), got 0.5"},
      {"nan lower_bound", [](C& c) { c.lower_bound = std::nanf(""); }, "lower_bound: must be a finite number <= 0"},
      {"A_log shape",
       [](C& c) {
         c.use_gate_in_kernel = true;
         c.A_log = ContiguousView<const void*>(kALog, DType::kF32, {3});
       },
       "A_log: expected HV = 2 elements ([HV]), got shape [3]"},
      {"A_log bfloat16",
       [](C& c) {
         c.use_gate_in_kernel = true;
         c.A_log = ContiguousView<const void*>(kALog, DType::kBF16, {2});
       },
       "A_log: dtype must be float32, got bfloat16", kDType},
      {"dt_bias shape",
       [](C& c) {
         c.use_gate_in_kernel = true;
         c.A_log = ContiguousView<const void*>(kALog, DType::kF32, {2});
         c.dt_bias = ContiguousView<const void*>(kALog, DType::kF32, {2, 15});
       },
       "dt_bias: expected HV*K = 32 elements ([HV*K] or [HV, K]), got shape [2, 15]"},
      {"dt_bias [HV * K] with a scalar gate",
       [](C& c) {
         c.g.ndim = 3;
         c.use_gate_in_kernel = true;
         c.A_log = ContiguousView<const void*>(kALog, DType::kF32, {2});
         c.dt_bias = ContiguousView<const void*>(kALog, DType::kF32, {2, 16});
       },
       "dt_bias: expected HV = 2 elements ([HV], one per value head with a scalar gate g), got shape [2, 16]"},
      {"D with the delta correction", [](C& c) { c.D = ContiguousView<const void*>(kALog, DType::kF32, {2}); },
       "D: Mamba2's skip o + D v needs delta_correction=False"},
      {"D shape",
       [](C& c) {
         c.delta_correction = false;
         c.D = ContiguousView<const void*>(kALog, DType::kF32, {3});
       },
       "D: expected HV = 2 elements ([HV]), got shape [3]"},
  };
}

TEST(KdaValidation, ChunkRejectsBadCallsWithoutWriting) {
  ExpectCasesRefused<ChunkFixture>(TokenCases<ChunkKdaCall>());
  static const int64_t kCuFirst[] = {1, 3, 4};
  static const int64_t kCuDecreasing[] = {0, 5, 4};
  static const int64_t kCuShort[] = {0, 3, 3};
  static const int32_t kCuShort32[] = {0, 3, 3};
  using C = ChunkKdaCall;
  const Refusal kBind = Refusal::kBind;
  const Refusal kDType = Refusal::kDType;
  ExpectCasesRefused<ChunkFixture, C>({
      // The messages in full, as the fixture's call makes them.
      {"q 3-D", [](C& c) { c.q.ndim = 3; }, "chunk_kda: q: expected a 4-D array [B, T, H, K], got shape [1, 4, 2]"},
      {"k shape", [](C& c) { c.k.shape[3] = 32; },
       "chunk_kda: k: expected shape [B, T, H, K] (q's shape) = [1, 4, 2, 16], got [1, 4, 2, 32]"},
      {"v shape", [](C& c) { c.v.shape[1] = 3; },
       "v: expected shape [B, T, HV, V] (B, T of q) = [1, 4, 2, 16], got [1, 3, 2, 16]"},
      {"beta shape", [](C& c) { c.beta.ndim = 4; }, "beta: expected shape [B, T, HV] = [1, 4, 2], got [1, 4, 2, 0]"},
      // Gated DeltaNet's entry: g one decay per value head only, fla's chunk sizes and wording.
      {"GDN entry, g [B, T, HV, K]", [](C& c) { c.entry = DeltaRuleEntry::kGatedDeltaRule; },
       "chunk_gated_delta_rule: g: expected shape [B, T, HV] (HV of v) = [1, 4, 2], got [1, 4, 2, 16]"},
      {"GDN entry, chunk_size 48",
       [](C& c) {
         c.entry = DeltaRuleEntry::kGatedDeltaRule;
         c.g.ndim = 3;
         c.chunk_size = 48;
       },
       "chunk_gated_delta_rule: `chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got 48."},
      {"KDA chunk_size 16", [](C& c) { c.chunk_size = 16; },
       "chunk_kda: `chunk_size` must be either 32 or 64 for KDA, got 16."},
      {"q heads transposed",
       [](C& c) {
         SetStrides(c.q, {128, 32, 1, 2});
       },
       "chunk_kda: q: must be C-contiguous or a token-strided slice [B, T, heads, dim] with strides [T * s, s, dim, "
       "1], s >= heads * dim (a fused projection's columns); shape [1, 4, 2, 16] has strides [128, 32, 1, 2] (make "
       "a contiguous copy first)"},
      // The data of the states and sequence boundaries.
      {"null cu_seqlens", [](C& c) { c.cu_seqlens.data = nullptr; }, "cu_seqlens is null", kBind},
      {"null initial_state", [](C& c) { c.initial_state.data = nullptr; }, "initial_state is null", kBind},
      {"null final_state", [](C& c) { c.final_state.data = nullptr; }, "final_state is null", kBind},
      {"absent final_state", [](C& c) { c.final_state = {}; },
       "final_state: required with output_final_state (shape [N, HV, K, V])", kBind},
      {"shifted alias", [](C& c) { c.initial_state.data = static_cast<float*>(c.final_state.data) + 1; },
       "initial_state and final_state overlap without being the same buffer", kBind},
      // With grouped heads a state has HV (not H) heads: a shift of N * H * K * V still overlaps.
      {"shifted alias, grouped heads",
       [](C& c) {
         static float scratch[3 * 2 * kStateElems];
         c.q.shape[2] = c.k.shape[2] = 1;
         c.initial_state.data = scratch;
         c.final_state.data = scratch + kStateElems;
       },
       "initial_state and final_state overlap without being the same buffer", kBind},
      // Their shapes, layouts and dtypes.
      {"initial_state shape", [](C& c) { c.initial_state.shape[0] = 3; },
       "initial_state: expected shape [N, HV, K, V] = [2, 2, 16, 16], got [3, 2, 16, 16]"},
      {"final_state shape", [](C& c) { c.final_state.shape[2] = 32; },
       "final_state: expected shape [N, HV, K, V] = [2, 2, 16, 16], got [2, 2, 32, 16]"},
      {"cu_seqlens 2-D",
       [](C& c) {
         c.cu_seqlens = ContiguousView(c.cu_seqlens.data, DType::kI64, {1, 3});
       },
       "cu_seqlens: expected shape [N + 1] with N >= 1, got [1, 3]"},
      {"N = 0", [](C& c) { c.cu_seqlens.shape[0] = 1; }, "cu_seqlens: expected shape [N + 1] with N >= 1, got [1]"},
      {"B = 0 without cu_seqlens",
       [](C& c) {
         c.cu_seqlens = {};
         SetTokenDim(c, 0, 0);
       },
       "q: chunk_kda needs at least one sequence (B >= 1), got shape [0, 4, 2, 16]"},
      {"cu_seqlens with B = 2",
       [](C& c) {
         SetTokenDim(c, 0, 2);
         SetTokenDim(c, 1, 2);
       },
       "q: with cu_seqlens the batch must be packed as B = 1, got shape [2, 2, 2, 16]"},
      {"final_state with a gap", [](C& c) { AddGap(c.final_state, 0); },
       "final_state: must be C-contiguous (row-major, no gaps); shape [2, 2, 16, 16] has stride 1024 in dimension 0"},
      {"initial_state with a gap", [](C& c) { AddGap(c.initial_state, 3); }, "initial_state: must be C-contiguous"},
      {"cu_seqlens with a gap", [](C& c) { AddGap(c.cu_seqlens, 0); }, "cu_seqlens: must be C-contiguous"},
      {"cu_seqlens float32", [](C& c) { c.cu_seqlens.dtype = DType::kF32; },
       "cu_seqlens: dtype must be int32 or int64, got float32", kDType},
      {"cu_seqlens uint64", [](C& c) { c.cu_seqlens.foreign_dtype = "uint64"; },
       "cu_seqlens: dtype must be int32 or int64, got uint64", kDType},
      {"initial_state bfloat16", [](C& c) { c.initial_state.dtype = DType::kBF16; },
       "initial_state: dtype must be float32, got bfloat16", kDType},
      {"final_state float64", [](C& c) { c.final_state.foreign_dtype = "float64"; },
       "final_state: dtype must be float32, got float64", kDType},
      {"final_state without output_final_state", [](C& c) { c.output_final_state = false; },
       "final_state given without output_final_state"},
      // The values of cu_seqlens (read by the shape check too when given).
      {"cu[0] != 0", [](C& c) { c.cu_seqlens.data = kCuFirst; }, "chunk_kda: cu_seqlens[0] must be 0, got 1"},
      {"cu decreasing", [](C& c) { c.cu_seqlens.data = kCuDecreasing; },
       "cu_seqlens must be non-decreasing, but cu_seqlens[2] = 4 < cu_seqlens[1] = 5"},
      {"cu[N] != T", [](C& c) { c.cu_seqlens.data = kCuShort; }, "cu_seqlens[N] must equal T, got 3 with T = 4"},
      {"int32 cu[N] != T", [](C& c) { c.cu_seqlens = ContiguousView<const void*>(kCuShort32, DType::kI32, {3}); },
       "cu_seqlens[N] must equal T, got 3 with T = 4"},
  });
}

TEST(KdaValidation, ChunkPoolFormRejectsBadCallsWithoutWriting) {
  static const int32_t kOutOfRange[] = {1, 4};
  static const int32_t kDuplicate[] = {2, 2};
  static const int64_t kWide[] = {1, 3};
  static const float kState[2 * kStateElems] = {};
  static float scratch[2 * kStateElems];
  using C = ChunkKdaCall;
  const Refusal kBind = Refusal::kBind;
  const Refusal kDType = Refusal::kDType;
  ExpectCasesRefused<ChunkPoolFixture, C>({
      {"index out of range", [](C& c) { c.state_indices.data = kOutOfRange; },
       "state_indices[1] = 4 is out of range for num_states = 4"},
      {"duplicate index", [](C& c) { c.state_indices.data = kDuplicate; },
       "duplicate state index 2 in state_indices[0] and state_indices[1]"},
      {"null state", [](C& c) { c.state.data = nullptr; }, "chunk_kda: state is null", kBind},
      {"null state_indices", [](C& c) { c.state_indices.data = nullptr; }, "state_indices is null", kBind},
      {"null has_initial_state", [](C& c) { c.has_initial_state.data = nullptr; }, "has_initial_state is null", kBind},
      {"absent state", [](C& c) { c.state = {}; }, "state_indices: needs the state pool (state [S, HV, K, V])"},
      {"also initial_state",
       [](C& c) {
         c.initial_state = ContiguousView<const void*>(kState, DType::kF32, {2, 2, 16, 16});
       },
       "state_indices (pool form) excludes initial_state and final_state"},
      {"also final_state",
       [](C& c) {
         c.output_final_state = true;
         c.final_state = ContiguousView<void*>(scratch, DType::kF32, {2, 2, 16, 16});
       },
       "state_indices (pool form) excludes initial_state and final_state"},
      {"state without indices", [](C& c) { c.state_indices = {}; }, "state (pool form) requires state_indices"},
      {"state shape", [](C& c) { c.state.shape[1] = 3; },
       "state: expected shape [S, HV, K, V] = [4, 2, 16, 16], got [4, 3, 16, 16]"},
      {"state 3-D", [](C& c) { c.state.ndim = 3; }, "state: expected a 4-D array [S, HV, K, V], got shape [4, 2, 16]"},
      {"state_indices shape", [](C& c) { c.state_indices.shape[0] = 3; },
       "state_indices: expected shape [N] = [2], got [3]"},
      {"has_initial_state shape", [](C& c) { c.has_initial_state.shape[0] = 1; },
       "has_initial_state: expected shape [N] = [2], got [1]"},
      {"state with a gap", [](C& c) { AddGap(c.state, 1); }, "state: must be C-contiguous"},
      {"state bfloat16", [](C& c) { c.state.dtype = DType::kBF16; }, "state: dtype must be float32, got bfloat16",
       kDType},
      {"state_indices int64", [](C& c) { c.state_indices = ContiguousView<const void*>(kWide, DType::kI64, {2}); },
       "state_indices: dtype must be int32, got int64", kDType},
      {"has_initial_state int32", [](C& c) { c.has_initial_state.dtype = DType::kI32; },
       "has_initial_state: dtype must be uint8, got int32", kDType},
  });
}

// Gated DeltaNet's entry runs what KDA's does with the same scalar gate, its chunk sizes (16 too) included:
// the entry names a call, it does not change its results.
TEST(KdaValidation, GatedDeltaRuleEntryRunsTheScalarGate) {
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    ChunkFixture kda;
    kda.call.g.ndim = 3;
    RunCall(kda.call, impl);
    for (int chunk_size : {16, 32, 64}) {
      ChunkFixture gdn;
      gdn.call.g.ndim = 3;
      gdn.call.entry = DeltaRuleEntry::kGatedDeltaRule;
      gdn.call.chunk_size = chunk_size;
      RunCall(gdn.call, impl);
      EXPECT_EQ(gdn.o, kda.o) << chunk_size;
      EXPECT_EQ(gdn.final_state, kda.final_state) << chunk_size;
    }
    RecurrentFixture rk;
    rk.call.g.ndim = 3;
    RunCall(rk.call, impl);
    RecurrentFixture rg;
    rg.call.g.ndim = 3;
    rg.call.entry = DeltaRuleEntry::kGatedDeltaRule;
    RunCall(rg.call, impl);
    EXPECT_EQ(rg.o, rk.o);
    EXPECT_EQ(rg.state, rk.state);
    EXPECT_FALSE(rk.Untouched());
  }
}

TEST(KdaValidation, RecurrentRejectsBadCallsWithoutWriting) {
  ExpectCasesRefused<RecurrentFixture>(TokenCases<RecurrentKdaCall>());
  static const int32_t kOutOfRange[] = {1, -1, 4};
  static const int32_t kDuplicate[] = {3, -1, 3};
  static const int64_t kCuShort[] = {0, 1, 1, 2};
  static const int64_t kCuTwo[] = {0, 1, 3};
  static const int32_t kAccepted[] = {1, 1, 1};
  static const int64_t kCuOnePer[] = {0, 1, 2, 3};
  using C = RecurrentKdaCall;
  const Refusal kBind = Refusal::kBind;
  const Refusal kDType = Refusal::kDType;
  ExpectCasesRefused<RecurrentFixture, C>({
      {"q 3-D", [](C& c) { c.q.ndim = 3; }, "q: expected a 4-D array [B, T, H, K], got shape [3, 1, 2]"},
      // Gated DeltaNet's entry names its calls; it takes both gate widths.
      {"GDN entry, scalar g shape",
       [](C& c) {
         c.entry = DeltaRuleEntry::kGatedDeltaRule;
         c.g.ndim = 3;
         c.g.shape[1] = 2;
       },
       "fused_recurrent_gated_delta_rule: g: expected shape [B, T, HV] (HV of v: a gate per value head; [B, T, HV, "
       "K]: one per key dimension) = [3, 1, 2], got [3, 2, 2]"},
      {"beta shape", [](C& c) { c.beta.shape[0] = 2; },
       "beta: expected shape [B, T, HV] or [B, T, HV, V] = [3, 1, 2], got [2, 1, 2]"},
      // The pool and its indices.
      {"null pool", [](C& c) { c.initial_state.data = nullptr; }, "initial_state is null", kBind},
      {"null indices", [](C& c) { c.ssm_state_indices.data = nullptr; }, "ssm_state_indices is null", kBind},
      {"absent pool", [](C& c) { c.initial_state = {}; },
       "ssm_state_indices: needs the state pool initial_state [S, HV, K, V]"},
      {"absent pool and indices",
       [](C& c) {
         c.initial_state = {};
         c.ssm_state_indices = {};
       },
       "initial_state: required with inplace_final_state=True (the state pool, or [N, HV, K, V])", kBind},
      // Without indices the states are contiguous, one per sequence.
      {"absent indices", [](C& c) { c.ssm_state_indices = {}; },
       "initial_state: expected shape [N, HV, K, V] = [3, 2, 16, 16], got [4, 2, 16, 16]"},
      {"indices 3-D", [](C& c) { c.ssm_state_indices.ndim = 3; },
       "ssm_state_indices: expected shape [N] or [N, C] (a slot per token), got"},
      {"num_accepted_tokens with 1-D indices",
       [](C& c) { c.num_accepted_tokens = ContiguousView<const void*>(kAccepted, DType::kI32, {3}); },
       "num_accepted_tokens needs 2-D ssm_state_indices [N, C] (a slot per token)"},
      {"final_state with inplace_final_state", [](C& c) { c.final_state = c.initial_state; },
       "final_state given with inplace_final_state=True (the states go to initial_state)"},
      {"final_state without output_final_state",
       [](C& c) {
         c.inplace_final_state = false;
         c.final_state = c.initial_state;
       },
       "final_state given without output_final_state"},
      {"absent final_state",
       [](C& c) {
         c.inplace_final_state = false;
         c.output_final_state = true;
       },
       "final_state: required with output_final_state (shape [B * T, HV, K, V]: a state per token)", kBind},
      {"pool shape", [](C& c) { c.initial_state.shape[3] = 32; },
       "initial_state: expected shape [S, HV, K, V] = [4, 2, 16, 16], got [4, 2, 16, 32]"},
      {"indices shape", [](C& c) { c.ssm_state_indices.shape[0] = 2; },
       "ssm_state_indices: expected shape [N] = [3], got [2]"},
      {"pool with a gap", [](C& c) { AddGap(c.initial_state, 2); }, "initial_state: must be C-contiguous"},
      // Token-strided q, k, v: the B * T tokens one stride apart (B's stride T times the token stride).
      {"q batch stride not T token strides",
       [](C& c) {
         SetTokenDim(c, 1, 2);  // B = 3 rows of T = 2 tokens
         SetTokenStride(c.q, 48);
         c.q.strides[0] += 16;
       },
       "q: must be C-contiguous or a token-strided slice [B, T, heads, dim] with strides [T * s, s, dim, 1], s >= "
       "heads * dim (a fused projection's columns); shape [3, 2, 2, 16] has strides [112, 48, 16, 1]"},
      {"pool float64", [](C& c) { c.initial_state.foreign_dtype = "float64"; },
       "initial_state: dtype must be float32, bfloat16 or float16, got float64", kDType},
      {"indices int64", [](C& c) { c.ssm_state_indices.dtype = DType::kI64; },
       "ssm_state_indices: dtype must be int32, got int64", kDType},
      // The shape check names the call's ssm_state_indices, the bind the kernel's state_indices.
      {"index out of range", [](C& c) { c.ssm_state_indices.data = kOutOfRange; },
       "state_indices[2] = 4 is out of range for num_states = 4"},
      {"duplicate index", [](C& c) { c.ssm_state_indices.data = kDuplicate; }, "duplicate state index 3"},
      // The sequences: B rows, or packed with cu_seqlens (one index per sequence).
      {"packed without cu_seqlens", [](C& c) { PackTokens(c); },
       "ssm_state_indices: expected shape [N] = [1], got [3]"},
      {"cu_seqlens of two sequences",
       [](C& c) {
         PackTokens(c);
         c.cu_seqlens = ContiguousView<const void*>(kCuTwo, DType::kI64, {3});
       },
       "ssm_state_indices: expected shape [N] = [2], got [3]"},
      {"cu_seqlens ending early",
       [](C& c) {
         PackTokens(c);
         c.cu_seqlens = ContiguousView<const void*>(kCuShort, DType::kI64, {4});
       },
       "cu_seqlens[N] must equal T, got 2 with T = 3"},
      {"cu_seqlens with B = 3", [](C& c) { c.cu_seqlens = ContiguousView<const void*>(kCuOnePer, DType::kI64, {4}); },
       "q: with cu_seqlens the batch must be packed as B = 1, got shape [3, 1, 2, 16]"},
      {"cu_seqlens float32",
       [](C& c) {
         PackTokens(c);
         c.cu_seqlens = ContiguousView<const void*>(kCuOnePer, DType::kF32, {4});
       },
       "cu_seqlens: dtype must be int32 or int64, got float32", kDType},
  });
}

// The fixtures' calls, unmutated, are accepted and run by both implementations.
template <class Fixture>
void ExpectFixtureRuns() {
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    SCOPED_TRACE(KernelImplName(impl));
    Fixture f;
    EXPECT_NO_THROW(ShapesOf(f.call));
    EXPECT_NO_THROW(RunCall(f.call, impl));
    EXPECT_FALSE(f.Untouched());
  }
}

TEST(KdaValidation, ValidCallsRunInBothImplementations) {
  ExpectFixtureRuns<ChunkFixture>();
  ExpectFixtureRuns<ChunkPoolFixture>();
  ExpectFixtureRuns<RecurrentFixture>();
}

// A negative dimension is refused by the view checks (the shape check and the
// bind alike), naming the argument.
TEST(KdaValidation, NegativeSizesAreRefused) {
  const auto expect_refused = [](auto& f, const char* message) {
    ExpectRefused([&] { ShapesOf(f.call); }, Who(f.call), message, false);
    ExpectRefused([&] { BindCall(f.call); }, Who(f.call), message, false);
    for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
      ExpectRefused([&] { RunCall(f.call, impl); }, Who(f.call), message, false);
    }
    EXPECT_TRUE(f.Untouched());
  };
  {
    SCOPED_TRACE("chunk T < 0");
    ChunkFixture f;
    SetTokenDim(f.call, 1, -1);
    expect_refused(f, "chunk_kda: q: negative dimension in shape [1, -1, 2, 16]");
  }
  {
    SCOPED_TRACE("chunk pool of -1 states");
    ChunkPoolFixture f;
    f.call.state.shape[0] = -1;
    expect_refused(f, "chunk_kda: state: negative dimension in shape [-1, 2, 16, 16]");
  }
  {
    SCOPED_TRACE("recurrent pool of -1 states");
    RecurrentFixture f;
    f.call.initial_state.shape[0] = -1;
    expect_refused(f, "fused_recurrent_kda: initial_state: negative dimension in shape [-1, 2, 16, 16]");
  }
  {
    SCOPED_TRACE("recurrent N < 0");
    RecurrentFixture f;
    SetTokenDim(f.call, 0, -1);
    f.call.ssm_state_indices.shape[0] = -1;
    expect_refused(f, "fused_recurrent_kda: q: negative dimension in shape [-1, 1, 2, 16]");
  }
}

// The kernel arguments' snapshot dtype (intermediate states set it, no call
// does) is a float dtype; anything else is refused before any write.
TEST(KdaValidation, ChunkArgsRefuseANonFloatSnapshotDtype) {
  ChunkFixture f;
  ChunkKdaArgs a = BindChunkKda(f.call);
  a.snapshot_dtype = DType::kI32;
  const char* what = "snapshot_dtype must be F32, BF16 or F16, got I32";
  ExpectRefused([&] { chunk_kda_reference(a); }, Who(f.call), what, false);
  ExpectRefused([&] { chunk_kda_optimized(a); }, Who(f.call), what, false);
  EXPECT_TRUE(f.Untouched());
}

TEST(KdaValidation, DtypeProblemsThrowDTypeError) {
  ChunkFixture chunk;
  chunk.call.beta.foreign_dtype = "float16";
  EXPECT_THROW(BindChunkKda(chunk.call), DTypeError);
  EXPECT_THROW(CheckChunkKdaShapes(chunk.call), DTypeError);
  EXPECT_THROW(chunk_kda(chunk.call), DTypeError);
  RecurrentFixture rec;
  rec.call.k.dtype = DType::kI32;
  EXPECT_THROW(BindRecurrentKda(rec.call), DTypeError);
  EXPECT_THROW(CheckRecurrentKdaShapes(rec.call), DTypeError);
  EXPECT_THROW(fused_recurrent_kda(rec.call), DTypeError);
  // Other refusals are plain kda::Errors.
  ChunkFixture shape;
  shape.call.k.shape[1] = 5;
  try {
    BindChunkKda(shape.call);
    ADD_FAILURE() << "no error";
  } catch (const DTypeError& e) {
    ADD_FAILURE() << "a shape error thrown as DTypeError: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k: expected shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(chunk.Untouched() && rec.Untouched() && shape.Untouched());
}

TEST(KdaValidation, ChunkAcceptsEquivalentForms) {
  static const float kALog[] = {0.0F, 0.5F};
  static const float kDtBias[32] = {0.1F};
  // The fixture's call, then its reference outputs and final states.
  const auto run = [](const std::function<void(ChunkKdaCall&)>& change) {
    ChunkFixture f;
    change(f.call);
    EXPECT_NO_THROW(chunk_kda(f.call, KernelImpl::kReference));
    EXPECT_FALSE(f.Untouched());
    return Result{std::vector<float>(f.o.begin(), f.o.begin() + 4 * 2 * 16), f.final_state};
  };
  const Result want = run([](ChunkKdaCall&) {});
  // int32 sequence boundaries.
  static const int32_t kCu32[] = {0, 3, 4};
  testing::ExpectBitEqual(
      run([](ChunkKdaCall& c) { c.cu_seqlens = ContiguousView<const void*>(kCu32, DType::kI32, {3}); }), want);
  // Explicit strides equal to the C-contiguous ones (any stride on a unit dimension).
  testing::ExpectBitEqual(run([](ChunkKdaCall& c) {
                            SetStrides(c.q, {7, 32, 16, 1});
                            SetStrides(c.o, {128, 32, 16, 1});
                            SetStrides(c.final_state, {512, 256, 16, 1});
                          }),
                          want);
  // The scale given explicitly as its default K^-0.5.
  testing::ExpectBitEqual(run([](ChunkKdaCall& c) { c.scale = 0.25F; }), want);
  // The aliased state: the final state written over the initial one.
  ChunkFixture alias;
  std::copy(alias.h0.begin(), alias.h0.end(), alias.final_state.begin());
  alias.call.initial_state.data = alias.final_state.data();
  chunk_kda(alias.call, KernelImpl::kReference);
  EXPECT_EQ(alias.final_state, want.state);
  // The gate in the kernel, with and without dt_bias; without the gate A_log is ignored.
  for (bool dt_bias : {false, true}) {
    run([&](ChunkKdaCall& c) {
      c.use_gate_in_kernel = true;
      c.A_log = ContiguousView<const void*>(kALog, DType::kF32, {2});
      if (dt_bias) c.dt_bias = ContiguousView<const void*>(kDtBias, DType::kF32, {2, 16});
    });
  }
  testing::ExpectBitEqual(run([](ChunkKdaCall& c) { c.A_log = ContiguousView<const void*>(kALog, DType::kF32, {5}); }),
                          want);
}

TEST(KdaValidation, BatchRowsEqualThePackedForm) {
  // Without cu_seqlens the B rows of [B, T, H, K] are B sequences of T
  // tokens: the same call as their packed form [1, B * T, H, K], bit for bit.
  const Problem p =
      MakeProblem({.lengths = {37, 37, 37}, .H = 2, .K = 32, .gate = testing::GateKind::kStress, .seed = 7});
  const TypedInputs in(p, DType::kF32, DType::kF32);
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    SCOPED_TRACE(KernelImplName(impl));
    Result got[2];
    for (bool packed : {true, false}) {
      Result& r = got[packed ? 0 : 1];
      Typed o(p.q.size(), DType::kF32, kSentinel);
      r.state.assign(p.StateSize(), kSentinel);
      ChunkKdaCall c =
          packed ? ChunkCallFor(p, in, o.Mut()) : testing::TokenCall<ChunkKdaCall>(p, in, o.Mut(), p.N, p.cu[1]);
      testing::SetStates(p, c, p.h0.data(), r.state.data());
      chunk_kda(c, impl);
      r.o = o.ToF32();
    }
    testing::ExpectBitEqual(got[1], got[0]);
  }
}

TEST(KdaValidation, RecurrentAcceptsEquivalentForms) {
  // The three tokens packed as [1, 3, H, K] with cu_seqlens [0, 1, 2, 3]
  // (int64 or int32) are the [3, 1, H, K] call.
  static const int64_t kCu64[] = {0, 1, 2, 3};
  static const int32_t kCu32[] = {0, 1, 2, 3};
  RecurrentFixture plain;
  for (float& x : plain.state) x = 0.5F;
  fused_recurrent_kda(plain.call, KernelImpl::kReference);
  for (DType dt : {DType::kI64, DType::kI32}) {
    SCOPED_TRACE(DTypeName(dt));
    RecurrentFixture f;
    for (float& x : f.state) x = 0.5F;
    PackTokens(f.call);
    f.call.cu_seqlens =
        ContiguousView<const void*>(dt == DType::kI64 ? static_cast<const void*>(kCu64) : kCu32, dt, {4});
    EXPECT_NO_THROW(CheckRecurrentKdaShapes(f.call));
    fused_recurrent_kda(f.call, KernelImpl::kReference);
    EXPECT_EQ(f.o, plain.o);
    EXPECT_EQ(f.state, plain.state);
  }
  // An empty batch needs no buffers, in both implementations.
  auto empty = testing::NullTokenCall<RecurrentKdaCall>(0, 1, 1, 16);
  empty.o = ContiguousView<void*>(nullptr, DType::kF32, {0, 1, 1, 16});
  empty.initial_state = ContiguousView<void*>(nullptr, DType::kF32, {0, 1, 16, 16});
  empty.ssm_state_indices = ContiguousView<const void*>(nullptr, DType::kI32, {0});
  EXPECT_NO_THROW(fused_recurrent_kda_reference(BindRecurrentKda(empty)));
  EXPECT_NO_THROW(fused_recurrent_kda_optimized(BindRecurrentKda(empty)));
  // An empty batch against a pool that has states: its empty indices and
  // accepted counts may be null, and the pool is left as it is.
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    SCOPED_TRACE(KernelImplName(impl));
    RecurrentFixture f;
    SetTokenDim(f.call, 0, 0);
    f.call.o.data = nullptr;
    f.call.q.data = f.call.k.data = f.call.v.data = f.call.g.data = f.call.beta.data = nullptr;
    f.call.ssm_state_indices = ContiguousView<const void*>(nullptr, DType::kI32, {0, 2});
    f.call.num_accepted_tokens = ContiguousView<const void*>(nullptr, DType::kI32, {0});
    EXPECT_NO_THROW(fused_recurrent_kda(f.call, impl));
    EXPECT_TRUE(f.Untouched());
  }
}

// Indices [N, 1] are one slot per sequence, as [N] is, for any number of
// tokens, and take num_accepted_tokens (every count 1, the only column).
TEST(KdaValidation, RecurrentIndicesOfOneColumnAreOneSlotPerSequence) {
  static const int64_t kCu[] = {0, 2, 3};
  static const int32_t kSlots[] = {3, 1};
  static const int32_t kOnes[] = {1, 1};
  const auto run = [](KernelImpl impl, bool two_d, bool accepted) {
    RecurrentFixture f;
    for (size_t i = 0; i < f.state.size(); ++i) f.state[i] = 0.01F * static_cast<float>(i % 97);
    PackTokens(f.call);
    f.call.cu_seqlens = ContiguousView<const void*>(kCu, DType::kI64, {3});
    f.call.ssm_state_indices = two_d ? ContiguousView<const void*>(kSlots, DType::kI32, {2, 1})
                                     : ContiguousView<const void*>(kSlots, DType::kI32, {2});
    if (accepted) f.call.num_accepted_tokens = ContiguousView<const void*>(kOnes, DType::kI32, {2});
    EXPECT_NO_THROW(CheckRecurrentKdaShapes(f.call));
    fused_recurrent_kda(f.call, impl);
    return Result{f.o, f.state};
  };
  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    SCOPED_TRACE(KernelImplName(impl));
    const Result want = run(impl, false, false);
    // The final states went to slots 3 and 1; slots 0 and 2 are as they were.
    EXPECT_NE(want.state[3 * kStateElems], 0.01F * static_cast<float>((3 * kStateElems) % 97));
    for (size_t i : {size_t{5}, 2 * kStateElems + 5}) EXPECT_EQ(want.state[i], 0.01F * static_cast<float>(i % 97));
    testing::ExpectBitEqual(run(impl, true, false), want);
    testing::ExpectBitEqual(run(impl, true, true), want);
  }
}

TEST(KdaValidation, ShapeCheckNeedsNoData) {
  // Null data everywhere, outputs absent: the sizes the call implies.
  auto c = testing::NullTokenCall<ChunkKdaCall>(1, 10, 3, 32);
  c.q.dtype = c.k.dtype = c.v.dtype = DType::kBF16;
  c.cu_seqlens = ContiguousView<const void*>(nullptr, DType::kI32, {4});
  c.output_final_state = true;
  const auto expect_shapes = [](const KdaCallShapes& s, int64_t B, int64_t T, int64_t N, int64_t num_states) {
    EXPECT_EQ(s.B, B);
    EXPECT_EQ(s.T, T);
    EXPECT_EQ(s.N, N);
    EXPECT_EQ(s.H, 3);
    EXPECT_EQ(s.K, 32);
    EXPECT_EQ(s.V, 32);
    EXPECT_EQ(s.num_states, num_states);
  };
  expect_shapes(CheckChunkKdaShapes(c), 1, 10, 3, 0);
  // Binding needs the data and the outputs.
  ExpectErrorContaining([&] { BindChunkKda(c); }, "chunk_kda: q is null");
  // Index tensors are checked by value when their data is given.
  static const int64_t kCuDecreasing[] = {0, 4, 2, 10};
  static const int32_t kCuShort[] = {0, 4, 8, 9};
  static const int64_t kCuGood[] = {0, 4, 4, 10};
  c.cu_seqlens = ContiguousView<const void*>(kCuDecreasing, DType::kI64, {4});
  ExpectErrorContaining([&] { CheckChunkKdaShapes(c); }, "cu_seqlens must be non-decreasing");
  c.cu_seqlens = ContiguousView<const void*>(kCuShort, DType::kI32, {4});
  ExpectErrorContaining([&] { CheckChunkKdaShapes(c); }, "cu_seqlens[N] must equal T, got 9 with T = 10");
  c.cu_seqlens = ContiguousView<const void*>(kCuGood, DType::kI64, {4});
  expect_shapes(CheckChunkKdaShapes(c), 1, 10, 3, 0);
  // The pool form: S from the pool.
  c.output_final_state = false;
  c.state = ContiguousView<void*>(nullptr, DType::kF32, {7, 3, 32, 32});
  c.state_indices = ContiguousView<const void*>(nullptr, DType::kI32, {3});
  expect_shapes(CheckChunkKdaShapes(c), 1, 10, 3, 7);
  static const int32_t kDuplicate[] = {6, -1, 6};
  c.state_indices.data = kDuplicate;
  ExpectErrorContaining([&] { CheckChunkKdaShapes(c); }, "duplicate state index 6");
  // B rows without cu_seqlens.
  expect_shapes(CheckChunkKdaShapes(testing::NullTokenCall<ChunkKdaCall>(2, 5, 3, 32)), 2, 5, 2, 0);
  // A decode call.
  auto r = testing::NullTokenCall<RecurrentKdaCall>(6, 1, 3, 32);
  r.initial_state = ContiguousView<void*>(nullptr, DType::kF32, {9, 3, 32, 32});
  r.ssm_state_indices = ContiguousView<const void*>(nullptr, DType::kI32, {6});
  expect_shapes(CheckRecurrentKdaShapes(r), 6, 1, 6, 9);
  // The pool and its indices may be absent too (a caller learning N first).
  r.initial_state = {};
  r.ssm_state_indices = {};
  expect_shapes(CheckRecurrentKdaShapes(r), 6, 1, 6, 0);
  ExpectErrorContaining([&] { BindRecurrentKda(r); }, "fused_recurrent_kda: q is null");
  // Slots per token and accepted counts: by value as a bind checks them, once every index tensor's data
  // is given (2 rows of 2 tokens, 3 slots per sequence, a pool of 5).
  auto sp = testing::NullTokenCall<RecurrentKdaCall>(2, 2, 3, 32);
  sp.initial_state = ContiguousView<void*>(nullptr, DType::kF32, {5, 3, 32, 32});
  static const int32_t kSlots[] = {0, 1, 2, 3, 4, -1};
  static const int32_t kSlotOutOfRange[] = {0, 1, 2, 3, 5, -1};
  static const int32_t kSlotShared[] = {0, 1, 2, 1, 4, -1};
  static const int32_t kAccepted[] = {1, 2};
  static const int32_t kAcceptedTooMany[] = {1, 4};
  sp.ssm_state_indices = ContiguousView<const void*>(kSlots, DType::kI32, {2, 3});
  sp.num_accepted_tokens = ContiguousView<const void*>(kAccepted, DType::kI32, {2});
  expect_shapes(CheckRecurrentKdaShapes(sp), 2, 2, 2, 5);
  sp.ssm_state_indices.data = kSlotOutOfRange;
  ExpectErrorContaining([&] { CheckRecurrentKdaShapes(sp); },
                        "fused_recurrent_kda: ssm_state_indices[1, 1] = 5 is out of range for num_states = 5");
  sp.ssm_state_indices.data = kSlotShared;
  ExpectErrorContaining([&] { CheckRecurrentKdaShapes(sp); }, "state slot 1 is used by sequences 0 and 1");
  sp.ssm_state_indices.data = kSlots;
  sp.num_accepted_tokens.data = kAcceptedTooMany;
  ExpectErrorContaining([&] { CheckRecurrentKdaShapes(sp); },
                        "num_accepted_tokens[1] = 4 must be in [1, 3] (the columns of ssm_state_indices)");
  sp.num_accepted_tokens.data = nullptr;  // traced: left to the bind
  expect_shapes(CheckRecurrentKdaShapes(sp), 2, 2, 2, 5);
  sp.num_accepted_tokens = {};
  SetTokenDim(sp, 1, 4);  // 4 tokens a sequence, 3 slots
  ExpectErrorContaining([&] { CheckRecurrentKdaShapes(sp); },
                        "sequence 0 has 4 tokens but ssm_state_indices has 3 slots per sequence");
}

// ------------------------------------------------- dispatcher

// Saves an environment variable and, when destroyed, restores it and calls
// `reset` (which drops what was parsed from it).
class EnvVarScope {
 public:
  EnvVarScope(const char* name, void (*reset)()) : name_(name), reset_(reset) {
    const char* env = std::getenv(name);
    if (env != nullptr) saved_ = env;
  }
  ~EnvVarScope() {
    if (saved_) {
      setenv(name_, saved_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
    reset_();
  }
  EnvVarScope(const EnvVarScope&) = delete;
  EnvVarScope& operator=(const EnvVarScope&) = delete;

 private:
  const char* name_;
  void (*reset_)();
  std::optional<std::string> saved_;
};

// Restores KDA_KERNEL and the dispatcher defaults when a test ends.
class KdaDispatchTest : public ::testing::Test {
 protected:
  static void UseEnv(const char* value) {
    setenv("KDA_KERNEL", value, 1);
    internal::ResetDefaultKernelImplForTesting();
  }

 private:
  EnvVarScope env_{"KDA_KERNEL", &internal::ResetDefaultKernelImplForTesting};
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
  ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
  testing::SetStates(p, c, p.h0.data(), final_state.data());
  chunk_kda(c, KernelImpl::kReference);
  EXPECT_EQ(o.ToF32(), want.o);
  EXPECT_EQ(final_state, want.state);
  // Auto runs the optimized kernel: equal to the reference within the fp32 tolerance.
  chunk_kda(c);
  EXPECT_TRUE(AllCloseF32(o.ToF32().data(), want.o.data(), want.o.size()));
  EXPECT_TRUE(AllCloseF32(final_state.data(), want.state.data(), want.state.size()));

  // One decode step through the dispatcher equals the reference.
  RecurrentFixture r1, r2, r3;
  for (size_t i = 0; i < r1.state.size(); ++i) {
    r1.state[i] = r2.state[i] = r3.state[i] = 0.01F * static_cast<float>(i % 97);
  }
  fused_recurrent_kda(r1.call, KernelImpl::kReference);
  fused_recurrent_kda_reference(BindRecurrentKda(r2.call));
  EXPECT_EQ(r1.o, r2.o);
  EXPECT_EQ(r1.state, r2.state);
  fused_recurrent_kda(r3.call);
  EXPECT_TRUE(AllCloseF32(r3.o.data(), r2.o.data(), r2.o.size()));
  EXPECT_TRUE(AllCloseF32(r3.state.data(), r2.state.data(), r2.state.size()));
}

// ------------------------------------------------- ISA switch

// Restores KDA_ISA and the forced ISA when a test ends.
class KdaIsaTest : public ::testing::Test {
 private:
  EnvVarScope env_{"KDA_ISA", &internal::ResetKernelIsaForTesting};
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
