// Tests of the KDA kernels: the chunked reference against the token-by-token
// recurrent reference (two independent implementations of one function), a
// float64 recurrence as a third opinion, state layout, aliasing, zero-length
// sequences, padding, argument validation and the dispatcher.
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
#include "kda/kernels/kda.h"
#include "kernels/kda/dispatch_internal.h"
#include "tests/error_util.h"
#include "tests/kda_problem.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using kda::testing::AllCloseBF16;
using kda::testing::AllCloseF32;

using testing::BitEqual;
using testing::ChunkRun;
using testing::Describe;
using testing::ExpectClose;
using testing::ExpectErrorContaining;
using testing::GateKind;
using testing::kSentinel;
using testing::MakeProblem;
using testing::NormalizeRows;
using testing::Problem;
using testing::Result;
using testing::RoundInputsToBF16;
using testing::Spec;
using testing::Typed;

// chunk_kda_reference over the whole packed batch. With `alias` the initial
// state buffer is also the final state buffer.
Result RunChunk(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32, bool alias = false) {
  ChunkRun run;
  run.qkv = qkv;
  run.gb = gb;
  run.alias = alias;
  return testing::RunChunkWith(p, &chunk_kda_reference, run);
}

// Runs a scope with one worker thread and restores the previous count.
class SingleThreadScope {
 public:
  SingleThreadScope() : saved_(NumThreads()) { SetNumThreads(1); }
  ~SingleThreadScope() { SetNumThreads(saved_); }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int saved_;
};

// fused_recurrent_kda_reference token by token: step t runs every sequence
// that has a token t, the others are padding (index -1). Sequence n lives in
// slot n + 1 of the state buffer; slot 0 must never be touched.
Result RunRecurrent(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32) {
  // Hundreds of tiny kernel calls: when test processes oversubscribe the cores
  // (ctest -j), each OpenMP region can cost a scheduler time slice, so this
  // loop runs on one thread. The parallel path of the recurrent kernel is
  // covered by the padding and dispatcher tests.
  const SingleThreadScope single_thread;
  return testing::RunTokenByToken(p, &fused_recurrent_kda_reference, qkv, gb);
}

void CheckChunkMatchesRecurrent(const Spec& s) {
  SCOPED_TRACE(Describe(s));
  const Problem p = MakeProblem(s);
  ExpectClose(RunChunk(p), RunRecurrent(p));
}

const std::vector<int64_t> kRagged = {0, 1, 63, 64, 65, 130};

// ------------------------------------------------- chunk vs recurrent

TEST(KdaChunkVsRecurrent, RaggedBatchAcrossShapes) {
  uint32_t seed = 10;
  for (int h : {1, 2, 4}) {
    for (int k : {64, 128}) {
      for (bool init : {false, true}) {
        Spec s;
        s.lengths = kRagged;
        s.H = h;
        s.K = k;
        s.initial_state = init;
        s.seed = ++seed;
        CheckChunkMatchesRecurrent(s);
      }
    }
  }
}

TEST(KdaChunkVsRecurrent, SmallHeadDims) {
  for (int k : {16, 32}) {
    Spec s;
    s.lengths = {3, 0, 64, 100};
    s.K = k;
    s.seed = 20 + k;
    CheckChunkMatchesRecurrent(s);
  }
}

TEST(KdaChunkVsRecurrent, StressGates) {
  Spec s;
  s.lengths = {1, 64, 130, 200};
  s.H = 4;
  s.K = 128;
  s.gate = GateKind::kStress;
  s.seed = 31;
  CheckChunkMatchesRecurrent(s);

  s.lengths = kRagged;
  s.H = 2;
  s.K = 64;
  s.initial_state = false;
  s.scale = 0.3F;  // an explicit scale instead of K^-0.5
  s.seed = 32;
  CheckChunkMatchesRecurrent(s);
}

TEST(KdaChunkVsRecurrent, L2NormInKernel) {
  Spec s;
  s.lengths = kRagged;
  s.H = 2;
  s.K = 128;
  s.l2norm_in_kernel = true;
  s.seed = 41;
  CheckChunkMatchesRecurrent(s);

  // The in-kernel norm equals normalising beforehand (in double here).
  const Problem p = MakeProblem(s);
  Problem pre = p;
  pre.l2norm_in_kernel = false;
  NormalizeRows(pre.q, pre.K);
  NormalizeRows(pre.k, pre.K);
  ExpectClose(RunChunk(p), RunChunk(pre));
}

TEST(KdaChunkVsRecurrent, GateInKernel) {
  for (GateKind kind : {GateKind::kMild, GateKind::kStress}) {
    Spec s;
    s.lengths = kRagged;
    s.H = 2;
    s.K = 64;
    s.gate = kind;
    s.gate_in_kernel = true;
    s.l2norm_in_kernel = true;
    s.seed = kind == GateKind::kMild ? 51 : 52;
    CheckChunkMatchesRecurrent(s);

    // The in-kernel gate equals the pre-activated gate.
    const Problem p = MakeProblem(s);
    Problem pre = p;
    pre.gate_in_kernel = false;
    for (size_t i = 0; i < pre.g.size(); ++i) {
      const size_t c = i % (static_cast<size_t>(p.H) * p.K);  // channel h * K + d
      pre.g[i] = KdaGate(p.g[i] + p.dt_bias[c], p.a_log[c / p.K]);
    }
    const Result in_kernel = RunChunk(p);
    ExpectClose(in_kernel, RunChunk(pre));
    ExpectClose(RunRecurrent(p), RunRecurrent(pre));
  }
}

TEST(KdaChunkVsRecurrent, Bf16Inputs) {
  Spec s;
  s.lengths = kRagged;
  s.H = 2;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 61;
  Problem p = MakeProblem(s);
  RoundInputsToBF16(p);

  // bf16 storage of the same values runs the same fp32 arithmetic: the bf16
  // output is the fp32 output rounded once, the state is identical.
  const Result chunk_f32 = RunChunk(p);
  const Result chunk_bf16 = RunChunk(p, DType::kBF16, DType::kBF16);
  const Result rec_f32 = RunRecurrent(p);
  const Result rec_bf16 = RunRecurrent(p, DType::kBF16, DType::kBF16);
  ExpectClose(chunk_f32, rec_f32);
  EXPECT_EQ(chunk_bf16.state, chunk_f32.state);
  EXPECT_EQ(rec_bf16.state, rec_f32.state);
  for (size_t i = 0; i < chunk_f32.o.size(); ++i) {
    ASSERT_EQ(chunk_bf16.o[i], RoundBF16(chunk_f32.o[i])) << i;
    ASSERT_EQ(rec_bf16.o[i], RoundBF16(rec_f32.o[i])) << i;
  }
  EXPECT_TRUE(AllCloseBF16(chunk_bf16.o.data(), rec_bf16.o.data(), chunk_f32.o.data(), chunk_bf16.o.size()));
  EXPECT_TRUE(AllCloseF32(chunk_bf16.state.data(), rec_bf16.state.data(), chunk_bf16.state.size()));

  // bf16 gate and beta with fp32 q/k/v: the output stays fp32.
  ExpectClose(RunChunk(p, DType::kF32, DType::kBF16), RunRecurrent(p, DType::kF32, DType::kBF16));
  ExpectClose(RunChunk(p, DType::kF32, DType::kBF16), chunk_f32);
}

// ------------------------------------------------- float64 third opinion

// The recurrence of design §2 in double, written independently of both kernels
// (including the in-kernel L2 norm and gate).
Result NaiveRecurrenceF64(const Problem& p) {
  const int kd = p.K;
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(kd));
  Result r;
  r.o.assign(p.q.size(), 0.0F);
  r.state.assign(p.StateSize(), 0.0F);
  for (int64_t n = 0; n < p.N; ++n) {
    for (int h = 0; h < p.H; ++h) {
      const size_t soff = (static_cast<size_t>(n) * p.H + h) * kd * kd;
      std::vector<double> s(static_cast<size_t>(kd) * kd, 0.0);
      if (!p.h0.empty()) std::copy_n(p.h0.begin() + soff, s.size(), s.begin());
      for (int64_t t = p.cu[n]; t < p.cu[n + 1]; ++t) {
        const size_t row = (static_cast<size_t>(t) * p.H + h) * kd;
        std::vector<double> q(p.q.begin() + row, p.q.begin() + row + kd);
        std::vector<double> k(p.k.begin() + row, p.k.begin() + row + kd);
        double qq = 0.0, kk = 0.0;
        for (int d = 0; d < kd; ++d) qq += q[d] * q[d], kk += k[d] * k[d];
        for (int d = 0; d < kd; ++d) {
          if (p.l2norm_in_kernel) q[d] /= std::sqrt(qq + 1e-6), k[d] /= std::sqrt(kk + 1e-6);
          q[d] *= scale;
        }
        const double beta = p.beta[static_cast<size_t>(t) * p.H + h];
        for (int d = 0; d < kd; ++d) {
          double g = p.g[row + d];
          if (p.gate_in_kernel) {
            const double x = g + p.dt_bias[static_cast<size_t>(h) * kd + d];
            g = -std::exp(static_cast<double>(p.a_log[h])) * (x > 20 ? x : std::log1p(std::exp(x)));
          }
          for (int j = 0; j < kd; ++j) s[d * kd + j] *= std::exp(g);
        }
        for (int j = 0; j < kd; ++j) {
          double kv = 0.0;
          for (int d = 0; d < kd; ++d) kv += k[d] * s[d * kd + j];
          const double delta = beta * (p.v[row + j] - kv);
          double o = 0.0;
          for (int d = 0; d < kd; ++d) {
            s[d * kd + j] += k[d] * delta;
            o += q[d] * s[d * kd + j];
          }
          r.o[row + j] = static_cast<float>(o);
        }
      }
      for (size_t i = 0; i < s.size(); ++i) r.state[soff + i] = static_cast<float>(s[i]);
    }
  }
  return r;
}

TEST(KdaNumerics, BothKernelsMatchFloat64Recurrence) {
  for (bool in_kernel : {false, true}) {
    Spec s;
    s.lengths = {5, 0, 70};
    s.H = 2;
    s.K = 16;
    s.gate = GateKind::kStress;
    s.l2norm_in_kernel = in_kernel;
    s.gate_in_kernel = in_kernel;
    s.seed = 71;
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    const Result want = NaiveRecurrenceF64(p);
    ExpectClose(RunChunk(p), want);
    ExpectClose(RunRecurrent(p), want);
  }
}

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

// ------------------------------------------------- state semantics

// One token, K = V = 16, H = 1, with a non-symmetric initial state
// S0[i][j] = 100 i + j (K-major, index i * V + j).
Problem OneTokenProblem() {
  Problem p;
  p.T = 1;
  p.N = 1;
  p.H = 1;
  p.K = 16;
  p.cu = {0, 1};
  p.q.assign(16, 0.0F);
  p.k.assign(16, 0.0F);
  p.v.resize(16);
  for (int j = 0; j < 16; ++j) p.v[j] = 0.25F * static_cast<float>(j) - 1.0F;
  p.g.assign(16, 0.0F);
  p.beta = {0.0F};
  p.h0.resize(256);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) p.h0[i * 16 + j] = static_cast<float>(100 * i + j);
  }
  return p;
}

TEST(KdaStateLayout, OutputReadsRowOfKMajorState) {
  // g = 0, beta = 0, q = e_i: the state is unchanged and o = scale * S[i][:].
  Problem p = OneTokenProblem();
  const int i = 3;
  p.q[i] = 1.0F;
  p.k[7] = 1.0F;
  const float scale = 0.25F;  // K^-0.5 at K = 16
  for (const Result& r : {RunChunk(p), RunRecurrent(p)}) {
    for (int j = 0; j < 16; ++j) EXPECT_EQ(r.o[j], scale * p.h0[i * 16 + j]) << "j=" << j;
    EXPECT_EQ(r.state, p.h0);
  }
}

TEST(KdaStateLayout, UpdateWritesRowOfKMajorState) {
  // g = 0, beta = 1, k = e_i: S1 = S0 + e_i (v - S0^T e_i)^T, so row i becomes v
  // and the other rows stay; o = scale * S1[m][:] for q = e_m.
  Problem p = OneTokenProblem();
  const int i = 5;
  const int m = 5;
  p.k[i] = 1.0F;
  p.q[m] = 1.0F;
  p.beta = {1.0F};
  std::vector<float> want = p.h0;
  for (int j = 0; j < 16; ++j) want[i * 16 + j] = p.v[j];
  std::vector<float> want_o(16);
  for (int j = 0; j < 16; ++j) want_o[j] = 0.25F * p.v[j];
  for (const Result& r : {RunChunk(p), RunRecurrent(p)}) {
    EXPECT_TRUE(AllCloseF32(r.state.data(), want.data(), want.size()));
    EXPECT_TRUE(AllCloseF32(r.o.data(), want_o.data(), want_o.size()));
  }
}

TEST(KdaChunkState, AliasedInitialAndFinalStateMatchSeparate) {
  Spec s;
  s.lengths = {0, 65, 1, 0, 130};
  s.H = 2;
  s.K = 32;
  s.gate = GateKind::kStress;
  s.seed = 81;
  const Problem p = MakeProblem(s);
  const Result separate = RunChunk(p);
  const Result aliased = RunChunk(p, DType::kF32, DType::kF32, /*alias=*/true);
  EXPECT_EQ(separate.o, aliased.o);
  EXPECT_EQ(separate.state, aliased.state);
}

TEST(KdaChunkState, ZeroLengthSequencesKeepTheirState) {
  Spec s;
  s.lengths = {0, 5, 0};
  s.H = 2;
  s.K = 16;
  s.seed = 91;
  const Problem p = MakeProblem(s);
  const size_t per_seq = static_cast<size_t>(p.H) * p.K * p.K;
  for (bool alias : {false, true}) {
    const Result r = RunChunk(p, DType::kF32, DType::kF32, alias);
    for (int64_t n : {0, 2}) {
      EXPECT_TRUE(BitEqual(r.state.data() + n * per_seq, p.h0.data() + n * per_seq, per_seq))
          << "sequence " << n << (alias ? " (aliased)" : "");
    }
  }
  // A null initial state is zero.
  Problem no_h0 = p;
  no_h0.h0.clear();
  const Result r = RunChunk(no_h0);
  for (int64_t n : {0, 2}) {
    for (size_t i = 0; i < per_seq; ++i) ASSERT_EQ(r.state[n * per_seq + i], 0.0F);
  }
}

// The first `len` tokens of a single-sequence problem (sequence 0 only).
Problem Prefix(const Problem& p, int64_t begin, int64_t len) {
  Problem r = p;
  const size_t hk = static_cast<size_t>(p.H) * p.K;
  auto cut = [&](std::vector<float>& x, size_t row) {
    x = std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(begin * row),
                           x.begin() + static_cast<std::ptrdiff_t>((begin + len) * row));
  };
  cut(r.q, hk);
  cut(r.k, hk);
  cut(r.v, hk);
  cut(r.g, hk);
  cut(r.beta, static_cast<size_t>(p.H));
  r.T = len;
  r.N = 1;
  r.cu = {0, len};
  return r;
}

TEST(KdaChunkState, OutputsAreExactlyCausal) {
  // Token t's output must not depend on later tokens, not even at rounding level (design §8.3).
  Spec s;
  s.lengths = {150};
  s.H = 2;
  s.K = 32;
  s.gate = GateKind::kStress;
  s.seed = 111;
  const Problem p = MakeProblem(s);
  const Result full = RunChunk(p);
  for (int64_t len : {1, 40, 64, 100}) {
    const Result part = RunChunk(Prefix(p, 0, len));
    EXPECT_TRUE(BitEqual(part.o.data(), full.o.data(), part.o.size())) << "prefix of " << len;
  }
}

TEST(KdaChunkState, SplitPrefillMatchesUnsplit) {
  // Prefill in two calls, carrying the state, equals one call (within the fp32 tolerance:
  // the chunk boundaries move).
  Spec s;
  s.lengths = {150};
  s.H = 2;
  s.K = 32;
  s.seed = 121;
  const Problem p = MakeProblem(s);
  const Result full = RunChunk(p);
  for (int64_t split : {1, 50, 64, 129}) {
    SCOPED_TRACE("split at " + std::to_string(split));
    const Result first = RunChunk(Prefix(p, 0, split));
    Problem rest = Prefix(p, split, 150 - split);
    rest.h0 = first.state;
    const Result second = RunChunk(rest);
    const size_t head = first.o.size();
    EXPECT_TRUE(AllCloseF32(first.o.data(), full.o.data(), head));
    EXPECT_TRUE(AllCloseF32(second.o.data(), full.o.data() + head, second.o.size()));
    EXPECT_TRUE(AllCloseF32(second.state.data(), full.state.data(), full.state.size()));
  }
}

TEST(KdaChunkState, EmptyBatchCopiesInitialState) {
  // T = 0: no token buffers at all; final state = initial state.
  const std::vector<int64_t> cu = {0, 0, 0};
  std::vector<float> h0(2 * 16 * 16);
  for (size_t i = 0; i < h0.size(); ++i) h0[i] = static_cast<float>(i) - 100.0F;
  std::vector<float> final_state(h0.size(), kSentinel);
  ChunkKdaArgs a;
  a.final_state = final_state.data();
  a.cu_seqlens = cu.data();
  a.initial_state = h0.data();
  a.N = 2;
  a.H = 1;
  a.K = a.V = 16;
  chunk_kda_reference(a);
  EXPECT_EQ(final_state, h0);
}

TEST(KdaChunkState, NoFinalStateWhenNotRequested) {
  Spec s;
  s.lengths = {3, 70};
  s.H = 1;
  s.K = 16;
  const Problem p = MakeProblem(s);
  const Typed q(p.q, DType::kF32), k(p.k, DType::kF32), v(p.v, DType::kF32), g(p.g, DType::kF32),
      beta(p.beta, DType::kF32);
  Typed o(p.q.size(), DType::kF32, kSentinel);
  std::vector<float> final_state(p.StateSize(), kSentinel);
  ChunkKdaArgs a;
  a.o = o.Mut();
  a.final_state = final_state.data();
  a.q = q.Const();
  a.k = k.Const();
  a.v = v.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.initial_state = p.h0.data();
  a.output_final_state = false;
  a.T = p.T;
  a.N = p.N;
  a.H = p.H;
  a.K = a.V = p.K;
  chunk_kda_reference(a);
  for (float x : final_state) ASSERT_EQ(x, kSentinel);
  EXPECT_TRUE(AllCloseF32(o.ToF32().data(), RunChunk(p).o.data(), p.q.size()));
  a.final_state = nullptr;  // not needed without output_final_state
  EXPECT_NO_THROW(chunk_kda_reference(a));
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
  const Typed q(p.q, DType::kF32), k(p.k, DType::kF32), v(p.v, DType::kF32), g(p.g, DType::kF32),
      beta(p.beta, DType::kF32);
  Typed o(p.q.size(), DType::kF32, kSentinel);
  std::vector<float> final_state(p.StateSize(), kSentinel);
  ChunkKdaArgs a;
  a.o = o.Mut();
  a.final_state = final_state.data();
  a.q = q.Const();
  a.k = k.Const();
  a.v = v.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.initial_state = p.h0.data();
  a.T = p.T;
  a.N = p.N;
  a.H = p.H;
  a.K = a.V = p.K;
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

}  // namespace
}  // namespace kda
