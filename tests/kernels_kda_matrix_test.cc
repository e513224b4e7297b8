// The KDA core kernels over the kernel matrix (tests/kernel_matrix.h): chunk
// (prefill) and recurrent (decode) kernels x {reference, optimized in every
// ISA the CPU supports}, each edge case written once. A chunk kernel is
// checked against the recurrent reference run token by token, a recurrent
// kernel against the chunk reference (independent implementations of one
// function, design §2.5 and §3), both against a float64 recurrence; then
// state layout and semantics (aliasing, empty sequences, padding, causality,
// split prefills, thread-count independence, aligned and unaligned outputs).
// Test names: Kda/<Suite>.<Case>/<kernel>_<impl>[_<isa>].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
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
#include "tests/kda_problem.h"
#include "tests/kernel_matrix.h"
#include "tests/thread_scope.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseBF16;
using testing::AllCloseF32;
using testing::AllVariants;
using testing::BitEqual;
using testing::ChunkArgsFor;
using testing::ChunkRun;
using testing::Describe;
using testing::ExpectBitEqual;
using testing::ExpectClose;
using testing::GateKind;
using testing::kSentinel;
using testing::MakeProblem;
using testing::NormalizeRows;
using testing::Problem;
using testing::Result;
using testing::RoundInputsToBF16;
using testing::Spec;
using testing::Typed;
using testing::TypedInputs;
using testing::Variant;
using testing::VariantName;
using testing::VariantParamName;
using testing::VariantScope;
using testing::VariantTest;

using testing::ThreadScope;

void (*ChunkFn(const Variant& v))(const ChunkKdaArgs&) {
  return v.optimized() ? &chunk_kda_optimized : &chunk_kda_reference;
}
void (*RecurrentFn(const Variant& v))(const RecurrentKdaArgs&) {
  return v.optimized() ? &fused_recurrent_kda_optimized : &fused_recurrent_kda_reference;
}

Result RunChunk(const Variant& v, const Problem& p, const ChunkRun& run = {}) {
  return testing::RunChunkWith(p, ChunkFn(v), run);
}

// Token by token: step t runs every sequence that has a token t, the others
// are padding (index -1); sequence n lives in slot n + 1 of the state buffer,
// slot 0 is never touched. Hundreds of tiny kernel calls: when test processes
// oversubscribe the cores (ctest -j), each OpenMP region can cost a scheduler
// time slice, so this runs on one thread unless `threads` says otherwise (the
// parallel path is covered by the thread-count and padding cases).
Result RunDecode(const Variant& v, const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32, int threads = 1) {
  const ThreadScope scope(threads);
  return testing::RunTokenByToken(p, RecurrentFn(v), qkv, gb);
}

const Variant kReference{KernelImpl::kReference, KernelIsa::kAuto};

// ------------------------------------------------- both kernels

enum class Kernel { kChunk, kRecurrent };

struct KdaParam {
  Kernel kernel = Kernel::kChunk;
  Variant variant;
};

std::vector<KdaParam> AllKdaParams() {
  std::vector<KdaParam> r;
  for (Kernel k : {Kernel::kChunk, Kernel::kRecurrent}) {
    for (const Variant& v : AllVariants()) r.push_back({k, v});
  }
  return r;
}

std::string KdaParamString(const KdaParam& p) {
  return std::string(p.kernel == Kernel::kChunk ? "chunk_" : "recurrent_") + VariantName(p.variant);
}
std::string KdaParamName(const ::testing::TestParamInfo<KdaParam>& info) { return KdaParamString(info.param); }
void PrintTo(const KdaParam& p, std::ostream* os) { *os << KdaParamString(p); }

class KdaKernelTest : public ::testing::TestWithParam<KdaParam> {
 protected:
  bool chunk() const { return GetParam().kernel == Kernel::kChunk; }
  const Variant& variant() const { return GetParam().variant; }

  // The kernel under test over the packed batch (q/k/v/o in qkv, g/beta in gb).
  Result Run(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32, int threads = 1) const {
    if (!chunk()) return RunDecode(variant(), p, qkv, gb, threads);
    const ThreadScope scope(threads);
    ChunkRun run;
    run.qkv = qkv;
    run.gb = gb;
    return RunChunk(variant(), p, run);
  }
  // The independent reference: the recurrent one for chunk kernels, the chunk one for recurrent kernels.
  Result Oracle(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32) const {
    if (!chunk()) {
      ChunkRun run;
      run.qkv = qkv;
      run.gb = gb;
      return RunChunk(kReference, p, run);
    }
    return RunDecode(kReference, p, qkv, gb);
  }
  void CheckAgainstOracle(const Spec& s) const {
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    ExpectClose(Run(p), Oracle(p));
  }

 private:
  VariantScope scope_{GetParam().variant};
};

// Lengths around the token blocks of the optimized prefill (32) and the
// chunks of the reference (64), with empty and one-token sequences.
const std::vector<int64_t> kRagged = {0, 1, 31, 32, 33, 63, 64, 65, 130};

TEST_P(KdaKernelTest, RaggedBatches) {
  uint32_t seed = 10;
  for (int h : {1, 3}) {
    for (int k : {64, 128}) {
      for (bool init : {false, true}) {
        Spec s;
        s.lengths = kRagged;
        s.H = h;
        s.K = k;
        s.initial_state = init;
        s.seed = ++seed;
        CheckAgainstOracle(s);
      }
    }
  }
}

TEST_P(KdaKernelTest, StressGates) {
  // Gates down to -250 per step: decays underflow to exactly 0.
  Spec s;
  s.lengths = {1, 64, 70, 200, 260};
  s.H = 2;
  s.K = 128;
  s.gate = GateKind::kStress;
  s.seed = 31;
  CheckAgainstOracle(s);

  s.lengths = kRagged;
  s.K = 64;
  s.initial_state = false;
  s.scale = 0.3F;  // an explicit scale instead of K^-0.5
  s.seed = 32;
  CheckAgainstOracle(s);
}

TEST_P(KdaKernelTest, LongSequences) {
  // Hundreds of tokens: the optimized prefill's scaled state rows are
  // materialised many times (mild gates reach the 2^-64 threshold after ~1000
  // steps in the slow dimensions, stress gates at every -250 step).
  for (GateKind gate : {GateKind::kMild, GateKind::kStress}) {
    Spec s;
    s.lengths = {1100};
    s.H = 1;
    s.K = 128;
    s.gate = gate;
    s.seed = gate == GateKind::kMild ? 221 : 222;
    CheckAgainstOracle(s);
  }
}

TEST_P(KdaKernelTest, HeadDims) {
  // 16, 32: one or two registers of columns; 48, 80: a partial column block
  // after full ones; 256: the largest head dim.
  uint32_t seed = 240;
  for (int k : {16, 32, 48, 80, 256}) {
    Spec s;
    s.lengths = k == 256 ? std::vector<int64_t>{5, 40} : std::vector<int64_t>{3, 0, 64, 100};
    s.H = 2;
    s.K = k;
    s.gate = GateKind::kStress;
    s.seed = ++seed;
    CheckAgainstOracle(s);
  }
}

TEST_P(KdaKernelTest, HeadGroups) {
  // Enough (sequence, head) pairs for the optimized prefill to run heads in
  // lockstep groups (including a partial last group: H = 10), two token blocks.
  Spec s;
  s.lengths = {40, 1, 0, 75};
  s.H = 10;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 225;
  CheckAgainstOracle(s);
}

TEST_P(KdaKernelTest, WithoutDecay) {
  // g = 0: the row scales stay exactly 1.
  Spec s;
  s.lengths = {40, 3};
  s.H = 2;
  s.K = 32;
  s.gate = GateKind::kNone;
  s.seed = 231;
  CheckAgainstOracle(s);
}

TEST_P(KdaKernelTest, InKernelNormAndGate) {
  for (GateKind gate : {GateKind::kMild, GateKind::kStress}) {
    Spec s;
    s.lengths = kRagged;
    s.H = 2;
    s.K = 64;
    s.gate = gate;
    s.gate_in_kernel = true;
    s.l2norm_in_kernel = true;
    s.seed = gate == GateKind::kMild ? 51 : 52;
    CheckAgainstOracle(s);

    // The in-kernel gate equals the pre-activated gate.
    const Problem p = MakeProblem(s);
    Problem pre = p;
    pre.gate_in_kernel = false;
    for (size_t i = 0; i < pre.g.size(); ++i) {
      const size_t c = i % (static_cast<size_t>(p.H) * p.K);  // channel h * K + d
      pre.g[i] = KdaGate(p.g[i] + p.dt_bias[c], p.a_log[c / p.K]);
    }
    ExpectClose(Run(p), Run(pre));
  }
  // The norm alone at K = 128; it equals normalising beforehand (in double here).
  Spec s;
  s.lengths = {0, 1, 50, 77};
  s.H = 2;
  s.K = 128;
  s.l2norm_in_kernel = true;
  s.seed = 41;
  CheckAgainstOracle(s);
  const Problem p = MakeProblem(s);
  Problem pre = p;
  pre.l2norm_in_kernel = false;
  NormalizeRows(pre.q, pre.K);
  NormalizeRows(pre.k, pre.K);
  ExpectClose(Run(p), Run(pre));
}

TEST_P(KdaKernelTest, Bf16Inputs) {
  for (int k : {64, 128}) {
    Spec s;
    s.lengths = {0, 1, 33, 65, 100};
    s.H = 2;
    s.K = k;
    s.gate = GateKind::kStress;
    s.l2norm_in_kernel = k == 128;
    s.seed = 260 + k;
    SCOPED_TRACE(Describe(s));
    Problem p = MakeProblem(s);
    RoundInputsToBF16(p);
    // bf16 storage of the same values runs the same fp32 arithmetic: the state
    // is identical to the fp32 run's, the output is the fp32 output rounded once.
    const Result f32 = Run(p);
    const Result bf16 = Run(p, DType::kBF16, DType::kBF16);
    EXPECT_TRUE(BitEqual(bf16.state.data(), f32.state.data(), f32.state.size()));
    for (size_t i = 0; i < f32.o.size(); ++i) ASSERT_EQ(bf16.o[i], RoundBF16(f32.o[i])) << i;
    const Result exact = Oracle(p);  // the fp32 run on the same (bf16-exact) inputs
    ExpectClose(f32, exact);
    const Result want_bf16 = Oracle(p, DType::kBF16, DType::kBF16);
    EXPECT_TRUE(AllCloseBF16(bf16.o.data(), want_bf16.o.data(), exact.o.data(), want_bf16.o.size()));
    EXPECT_TRUE(AllCloseF32(bf16.state.data(), want_bf16.state.data(), want_bf16.state.size()));
    // bf16 gate and beta with fp32 q/k/v: the output stays fp32.
    const Result mixed = Run(p, DType::kF32, DType::kBF16);
    ExpectClose(mixed, Oracle(p, DType::kF32, DType::kBF16));
    ExpectClose(mixed, f32);
  }
}

// The recurrence of design §2 in double, written independently of all the
// kernels (including the in-kernel L2 norm and gate).
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

TEST_P(KdaKernelTest, MatchesFloat64Recurrence) {
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
    ExpectClose(Run(p), NaiveRecurrenceF64(p));
  }
}

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

TEST_P(KdaKernelTest, OutputReadsRowOfKMajorState) {
  // g = 0, beta = 0, q = e_i: the state is unchanged and o = scale * S[i][:].
  Problem p = OneTokenProblem();
  const int i = 3;
  p.q[i] = 1.0F;
  p.k[7] = 1.0F;
  const float scale = 0.25F;  // K^-0.5 at K = 16
  const Result r = Run(p);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(r.o[j], scale * p.h0[i * 16 + j]) << "j=" << j;
  EXPECT_EQ(r.state, p.h0);
}

TEST_P(KdaKernelTest, UpdateWritesRowOfKMajorState) {
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
  const Result r = Run(p);
  EXPECT_TRUE(AllCloseF32(r.state.data(), want.data(), want.size()));
  EXPECT_TRUE(AllCloseF32(r.o.data(), want_o.data(), want_o.size()));
}

TEST_P(KdaKernelTest, ResultsDoNotDependOnThreadCountOrTaskSplit) {
  // Few (sequence, head) pairs: with several threads the optimized prefill
  // splits a head's value columns over tasks; many pairs: heads run in
  // lockstep groups of up to four. Every split must give the same bits.
  for (int h : {1, 3, 16}) {
    Spec s;
    s.lengths = h == 16 ? std::vector<int64_t>{70, 0, 33, 5} : std::vector<int64_t>{70};
    s.H = h;
    s.K = h == 16 ? 32 : 128;
    s.gate = GateKind::kStress;
    s.seed = 320 + h;
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    const Result one = Run(p);
    for (int threads : {2, 3, 8}) ExpectBitEqual(Run(p, DType::kF32, DType::kF32, threads), one);
  }
}

INSTANTIATE_TEST_SUITE_P(Kda, KdaKernelTest, ::testing::ValuesIn(AllKdaParams()), KdaParamName);

// ------------------------------------------------- chunk kernels (prefill)

class KdaChunkTest : public VariantTest {
 protected:
  Result Run(const Problem& p, const ChunkRun& run = {}) const { return RunChunk(variant(), p, run); }
};

TEST_P(KdaChunkTest, AliasedInitialAndFinalStateMatchSeparate) {
  Spec s;
  s.lengths = {0, 65, 1, 0, 130};
  s.H = 2;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 281;
  const Problem p = MakeProblem(s);
  ChunkRun alias;
  alias.alias = true;
  ExpectBitEqual(Run(p, alias), Run(p));
}

TEST_P(KdaChunkTest, EmptySequencesKeepTheirStateExactly) {
  Spec s;
  s.lengths = {0, 5, 0};
  s.H = 2;
  s.K = 32;
  s.seed = 291;
  const Problem p = MakeProblem(s);
  const size_t per_seq = static_cast<size_t>(p.H) * p.K * p.K;
  for (bool alias : {false, true}) {
    ChunkRun run;
    run.alias = alias;
    const Result r = Run(p, run);
    for (int64_t n : {0, 2}) {
      EXPECT_TRUE(BitEqual(r.state.data() + n * per_seq, p.h0.data() + n * per_seq, per_seq))
          << "sequence " << n << (alias ? " (aliased)" : "");
    }
  }
  // A null initial state is zero.
  Problem no_h0 = p;
  no_h0.h0.clear();
  const Result r = Run(no_h0);
  for (int64_t n : {0, 2}) {
    for (size_t i = 0; i < per_seq; ++i) ASSERT_EQ(r.state[n * per_seq + i], 0.0F);
  }
}

TEST_P(KdaChunkTest, EmptyBatchCopiesInitialState) {
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
  ChunkFn(variant())(a);
  EXPECT_EQ(final_state, h0);
}

TEST_P(KdaChunkTest, NoFinalStateWhenNotRequested) {
  Spec s;
  s.lengths = {3, 70};
  s.H = 1;
  s.K = 16;
  s.seed = 301;
  const Problem p = MakeProblem(s);
  ChunkRun run;
  run.output_final_state = false;
  const Result r = Run(p, run);
  for (float x : r.state) ASSERT_EQ(x, kSentinel);
  const Result want = Run(p);
  EXPECT_TRUE(BitEqual(r.o.data(), want.o.data(), want.o.size()));

  // Without output_final_state no final state buffer is needed.
  const Typed q(p.q, DType::kF32), g(p.g, DType::kF32), beta(p.beta, DType::kF32);
  Typed o(p.q.size(), DType::kF32, kSentinel);
  ChunkKdaArgs a;
  a.o = o.Mut();
  a.q = a.k = a.v = q.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.initial_state = p.h0.data();
  a.output_final_state = false;
  a.T = p.T;
  a.N = p.N;
  a.H = p.H;
  a.K = a.V = p.K;
  EXPECT_NO_THROW(ChunkFn(variant())(a));
}

// The tokens [begin, begin + len) of a single-sequence problem.
Problem Slice(const Problem& p, int64_t begin, int64_t len) {
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

TEST_P(KdaChunkTest, OutputsAreExactlyCausal) {
  // Token t's output must not depend on later tokens, not even at rounding level (design §8.3).
  Spec s;
  s.lengths = {150};
  s.H = 2;
  s.K = 32;
  s.gate = GateKind::kStress;
  s.seed = 111;
  const Problem p = MakeProblem(s);
  const Result full = Run(p);
  for (int64_t len : {1, 31, 33, 40, 64, 100}) {
    const Result part = Run(Slice(p, 0, len));
    EXPECT_TRUE(BitEqual(part.o.data(), full.o.data(), part.o.size())) << "prefix of " << len;
  }
}

TEST_P(KdaChunkTest, SplitPrefillMatchesUnsplit) {
  // Prefill in two calls, carrying the state, equals one call (within the fp32
  // tolerance: the reference's chunk boundaries move).
  Spec s;
  s.lengths = {150};
  s.H = 2;
  s.K = 32;
  s.seed = 121;
  const Problem p = MakeProblem(s);
  const Result full = Run(p);
  for (int64_t split : {1, 50, 64, 129}) {
    SCOPED_TRACE("split at " + std::to_string(split));
    const Result first = Run(Slice(p, 0, split));
    Problem rest = Slice(p, split, 150 - split);
    rest.h0 = first.state;
    const Result second = Run(rest);
    const size_t head = first.o.size();
    EXPECT_TRUE(AllCloseF32(first.o.data(), full.o.data(), head));
    EXPECT_TRUE(AllCloseF32(second.o.data(), full.o.data() + head, second.o.size()));
    EXPECT_TRUE(AllCloseF32(second.state.data(), full.state.data(), full.state.size()));
  }
}

TEST_P(KdaChunkTest, PrefillThenDecodeMatchesOnePrefill) {
  // Prefill the first tokens with this variant's chunk kernel, decode the rest
  // with its recurrent kernel: equal to one reference prefill.
  Spec s;
  s.lengths = {90};
  s.H = 2;
  s.K = 128;
  s.gate = GateKind::kStress;
  s.seed = 271;
  const Problem p = MakeProblem(s);
  const Result full = RunChunk(kReference, p);
  const Result first = Run(Slice(p, 0, 80));
  Problem tail = Slice(p, 80, 10);
  tail.h0 = first.state;
  const Result second = RunDecode(variant(), tail);
  EXPECT_TRUE(AllCloseF32(first.o.data(), full.o.data(), first.o.size()));
  EXPECT_TRUE(AllCloseF32(second.o.data(), full.o.data() + first.o.size(), second.o.size()));
  EXPECT_TRUE(AllCloseF32(second.state.data(), full.state.data(), full.state.size()));
}

TEST_P(KdaChunkTest, AlignedAndUnalignedOutputsGiveTheSameBits) {
  // Aligned output rows take the optimized prefill's streaming stores, others the plain ones.
  Spec s;
  s.lengths = {0, 1, 37, 70};
  s.H = 3;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 330;
  const Problem p = MakeProblem(s);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    ChunkRun aligned;
    aligned.qkv = dt;
    const Result want = Run(p, aligned);
    for (int shift : {1, 8}) {
      ChunkRun run = aligned;
      run.out_shift = shift;
      ExpectBitEqual(Run(p, run), want);
    }
  }
}

// ------------------------------------------------- pool form (state_indices)

// chunk_kda's outputs and its whole [S, H, K, V] state pool after a pool-form call.
struct PoolResult {
  std::vector<float> o;
  std::vector<float> pool;
};

// chunk_kda in the pool form: sequence n in slot idx[n] (< 0: padding) of a
// pool of num_states slots. Slots start as kSentinel; a sequence that reads
// its initial state (has_init empty or 1) finds p.h0[n] in its slot. Fresh
// sequences' slots keep the sentinel, which must never be read.
PoolResult RunChunkPool(const Variant& v, const Problem& p, const std::vector<int32_t>& idx,
                        const std::vector<uint8_t>& has_init, int64_t num_states, DType qkv = DType::kF32) {
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  PoolResult r;
  r.pool.assign(static_cast<size_t>(num_states) * per, kSentinel);
  for (int64_t n = 0; n < p.N; ++n) {
    if (idx[n] >= 0 && (has_init.empty() || has_init[n] != 0) && !p.h0.empty()) {
      std::copy_n(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, r.pool.begin() + idx[n] * per);
    }
  }
  const TypedInputs in(p, qkv, DType::kF32);
  Typed o(p.q.size(), qkv, kSentinel);
  ChunkKdaArgs a = ChunkArgsFor(p, in, o.Mut());
  a.state = r.pool.data();
  a.state_indices = idx.data();
  a.num_states = num_states;
  a.has_initial_state = has_init.empty() ? nullptr : has_init.data();
  ChunkFn(v)(a);
  r.o = o.ToF32();
  return r;
}

// p with the initial states of fresh sequences (has_init[n] == 0) zeroed.
Problem ZeroFreshStates(const Problem& p, const std::vector<uint8_t>& has_init) {
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  Problem r = p;
  for (int64_t n = 0; n < p.N; ++n) {
    if (!has_init.empty() && has_init[n] == 0) {
      std::fill_n(r.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, 0.0F);
    }
  }
  return r;
}

// The pool-form call against the contiguous form of the same kernel (initial
// states of fresh sequences zeroed), bit for bit: live sequences' outputs and
// final states (in their slots), padding outputs zero, every other slot
// untouched.
void ExpectPoolMatchesContiguous(const Variant& v, const Problem& p, const std::vector<int32_t>& idx,
                                 const std::vector<uint8_t>& has_init, int64_t num_states) {
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  const size_t hk = static_cast<size_t>(p.H) * p.K;
  const Result want = RunChunk(v, ZeroFreshStates(p, has_init));
  const PoolResult got = RunChunkPool(v, p, idx, has_init, num_states);
  std::vector<bool> used(static_cast<size_t>(num_states), false);
  for (int64_t n = 0; n < p.N; ++n) {
    SCOPED_TRACE("sequence " + std::to_string(n) + " slot " + std::to_string(idx[n]));
    const size_t rows = static_cast<size_t>(p.cu[n + 1] - p.cu[n]) * hk;
    const float* o = got.o.data() + p.cu[n] * hk;
    if (idx[n] < 0) {
      for (size_t i = 0; i < rows; ++i) ASSERT_EQ(o[i], 0.0F) << "padding output";
      continue;
    }
    used[idx[n]] = true;
    EXPECT_TRUE(BitEqual(o, want.o.data() + p.cu[n] * hk, rows)) << "outputs";
    EXPECT_TRUE(BitEqual(got.pool.data() + idx[n] * per, want.state.data() + n * per, per)) << "final state";
  }
  for (int64_t slot = 0; slot < num_states; ++slot) {
    if (used[slot]) continue;
    for (size_t i = 0; i < per; ++i) ASSERT_EQ(got.pool[slot * per + i], kSentinel) << "slot " << slot << " touched";
  }
}

TEST_P(KdaChunkTest, PoolFormMatchesContiguousForm) {
  // Permuted slots, fresh sequences (their slots hold sentinels), empty
  // sequences fresh and continuing; slots 0 and 4 belong to no sequence.
  Spec s;
  s.lengths = {0, 5, 70, 33, 1, 0};
  s.H = 3;
  s.K = 32;
  s.gate = GateKind::kStress;
  s.seed = 401;
  const Problem p = MakeProblem(s);
  const std::vector<int32_t> idx = {3, 7, 1, 5, 2, 6};
  ExpectPoolMatchesContiguous(variant(), p, idx, {1, 0, 1, 1, 0, 0}, 8);
  ExpectPoolMatchesContiguous(variant(), p, idx, {}, 8);
}

TEST_P(KdaChunkTest, PoolPaddingWritesZerosAndTouchesNoState) {
  // Padding sequences with and without tokens (indices -1 and -3), mixed with
  // live ones; slot 0, the dummy slot, is never used.
  Spec s;
  s.lengths = {4, 0, 7, 3, 40};
  s.H = 2;
  s.K = 16;
  s.seed = 411;
  const Problem p = MakeProblem(s);
  ExpectPoolMatchesContiguous(variant(), p, {2, -1, 5, -3, 1}, {1, 1, 0, 1, 1}, 6);
}

TEST_P(KdaChunkTest, PoolFormMatchesRecurrentReference) {
  // The pool form against the recurrent reference run token by token on the
  // contiguous problem (fresh states zeroed), fp32 and bf16 q/k/v/o.
  Spec s;
  s.lengths = {130, 1, 0, 65, 33};
  s.H = 4;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.l2norm_in_kernel = true;
  s.seed = 421;
  Problem p = MakeProblem(s);
  RoundInputsToBF16(p);
  const std::vector<int32_t> idx = {4, 9, -1, 1, 6};
  const std::vector<uint8_t> has_init = {1, 0, 0, 1, 0};
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  const size_t hk = static_cast<size_t>(p.H) * p.K;
  // The exact output of the bf16 run: the fp32 run on the same (bf16-exact) inputs.
  const Result exact = RunDecode(kReference, ZeroFreshStates(p, has_init), DType::kF32, DType::kF32);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const Result want = RunDecode(kReference, ZeroFreshStates(p, has_init), dt, DType::kF32);
    const PoolResult got = RunChunkPool(variant(), p, idx, has_init, 10, dt);
    EXPECT_TRUE(testing::AllFinite(got.o));
    for (int64_t n = 0; n < p.N; ++n) {
      if (idx[n] < 0) continue;
      SCOPED_TRACE("sequence " + std::to_string(n));
      const size_t rows = static_cast<size_t>(p.cu[n + 1] - p.cu[n]) * hk;
      const float* o = got.o.data() + p.cu[n] * hk;
      const float* wo = want.o.data() + p.cu[n] * hk;
      const float* xo = exact.o.data() + p.cu[n] * hk;
      EXPECT_TRUE(dt == DType::kF32 ? AllCloseF32(o, wo, rows) : AllCloseBF16(o, wo, xo, rows)) << "outputs";
      EXPECT_TRUE(AllCloseF32(got.pool.data() + idx[n] * per, want.state.data() + n * per, per)) << "final state";
    }
  }
}

TEST_P(KdaChunkTest, HasInitialStateInContiguousForm) {
  // has_initial_state[n] == 0 starts sequence n from zeros whatever its
  // initial_state holds, aliased or not; same bits as a zeroed initial state.
  Spec s;
  s.lengths = {5, 0, 40, 0};
  s.H = 2;
  s.K = 32;
  s.seed = 431;
  const Problem p = MakeProblem(s);
  const std::vector<uint8_t> has_init = {0, 0, 1, 1};
  const Result want = Run(ZeroFreshStates(p, has_init));
  for (bool alias : {false, true}) {
    SCOPED_TRACE(alias ? "aliased" : "separate");
    const Typed q(p.q, DType::kF32), k(p.k, DType::kF32), v(p.v, DType::kF32), g(p.g, DType::kF32),
        beta(p.beta, DType::kF32);
    Typed o(p.q.size(), DType::kF32, kSentinel);
    std::vector<float> final_state = alias ? p.h0 : std::vector<float>(p.StateSize(), kSentinel);
    ChunkKdaArgs a;
    a.o = o.Mut();
    a.final_state = final_state.data();
    a.q = q.Const();
    a.k = k.Const();
    a.v = v.Const();
    a.g = g.Const();
    a.beta = beta.Const();
    a.cu_seqlens = p.cu.data();
    a.initial_state = alias ? final_state.data() : p.h0.data();
    a.has_initial_state = has_init.data();
    a.T = p.T;
    a.N = p.N;
    a.H = p.H;
    a.K = a.V = p.K;
    a.options = p.Options();
    ChunkFn(variant())(a);
    ExpectBitEqual(Result{o.ToF32(), final_state}, want);
  }
}

// ------------------------------------------------- mid-sequence state snapshots

// Sequence n's first len tokens with its initial state, as a one-sequence problem.
Problem SequencePrefix(const Problem& p, int64_t n, int64_t len) {
  Problem r = Slice(p, p.cu[n], len);
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  if (!p.h0.empty())
    r.h0.assign(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per),
                p.h0.begin() + static_cast<std::ptrdiff_t>((n + 1) * per));
  return r;
}

struct SnapshotRun {
  Result result;                 // outputs and final states ([N, H, K, V], contiguous form)
  std::vector<float> snapshots;  // [snapshot_cu[N], H, K, V]
};

// The kernel in the contiguous form with snapshots at offsets[n] of sequence n.
SnapshotRun RunWithSnapshots(const Variant& v, const Problem& p, const std::vector<std::vector<int64_t>>& offsets) {
  std::vector<int64_t> snap_cu = {0};
  std::vector<int64_t> flat;
  for (const auto& o : offsets) {
    flat.insert(flat.end(), o.begin(), o.end());
    snap_cu.push_back(static_cast<int64_t>(flat.size()));
  }
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  SnapshotRun r;
  r.snapshots.assign(flat.size() * per, kSentinel);
  std::vector<float*> dst;
  for (size_t j = 0; j < flat.size(); ++j) dst.push_back(r.snapshots.data() + j * per);
  const Typed q(p.q, DType::kF32), k(p.k, DType::kF32), vv(p.v, DType::kF32), g(p.g, DType::kF32),
      beta(p.beta, DType::kF32);
  Typed o(p.q.size(), DType::kF32, kSentinel);
  r.result.state.assign(p.StateSize(), kSentinel);
  ChunkKdaArgs a;
  a.o = o.Mut();
  a.final_state = r.result.state.data();
  a.q = q.Const();
  a.k = k.Const();
  a.v = vv.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.initial_state = p.h0.empty() ? nullptr : p.h0.data();
  a.snapshot_cu = snap_cu.data();
  a.snapshot_offsets = flat.data();
  a.snapshot_states = dst.data();
  a.T = p.T;
  a.N = p.N;
  a.H = p.H;
  a.K = a.V = p.K;
  a.options = p.Options();
  ChunkFn(v)(a);
  r.result.o = o.ToF32();
  return r;
}

TEST_P(KdaChunkTest, SnapshotsMatchPrefixRunsAtRandomOffsets) {
  // The state after each requested offset, emitted in the one pass, against
  // the reference run over that prefix alone (fp32 state rule); the outputs
  // and final states are those of the run without snapshots, bit for bit.
  // Head groups (one thread) and value-column splits (eight threads, few pairs).
  std::mt19937 rng(1201);
  struct Case {
    int H, K, threads;
    GateKind gate;
  };
  for (const Case& c :
       {Case{3, 32, 1, GateKind::kMild}, Case{2, 128, 8, GateKind::kStress}, Case{4, 64, 3, GateKind::kMild}}) {
    SCOPED_TRACE("H " + std::to_string(c.H) + " K " + std::to_string(c.K) + " threads " + std::to_string(c.threads));
    const ThreadScope scope(c.threads);
    Spec s;
    std::uniform_int_distribution<int64_t> len_dist(0, 330);
    s.lengths = {len_dist(rng), 256, len_dist(rng), 0, 64, len_dist(rng)};
    s.H = c.H;
    s.K = c.K;
    s.gate = c.gate;
    s.seed = static_cast<uint32_t>(rng());
    const Problem p = MakeProblem(s);
    std::vector<std::vector<int64_t>> offsets(static_cast<size_t>(p.N));
    std::bernoulli_distribution take(0.6);
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t len = p.cu[n + 1] - p.cu[n];
      for (int64_t off = kSnapshotAlign; off < len; off += kSnapshotAlign) {
        if (take(rng)) offsets[n].push_back(off);
      }
      if (len > 0 && (len % kSnapshotAlign != 0 || take(rng))) offsets[n].push_back(len);
    }
    const SnapshotRun got = RunWithSnapshots(variant(), p, offsets);
    ExpectBitEqual(got.result, Run(p));
    const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
    size_t j = 0;
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t off : offsets[n]) {
        SCOPED_TRACE("sequence " + std::to_string(n) + " offset " + std::to_string(off));
        const Result want = RunChunk(kReference, SequencePrefix(p, n, off));
        EXPECT_TRUE(testing::AllCloseStateF32(got.snapshots.data() + j * per, want.state.data(), per));
        ++j;
      }
    }
    ASSERT_GT(j, 3U);
  }
}

TEST_P(KdaChunkTest, SnapshotsInPoolFormWithPaddingAndFreshSequences) {
  // The pool form (as the attention backend calls it): fresh sequences start
  // from zero, padding sequences have no snapshots; same snapshots as the
  // contiguous form with the fresh states zeroed.
  Spec s;
  s.lengths = {200, 7, 130, 64};
  s.H = 2;
  s.K = 32;
  s.seed = 1211;
  const Problem p = MakeProblem(s);
  const std::vector<int32_t> idx = {2, -1, 4, 1};
  const std::vector<uint8_t> has_init = {0, 1, 1, 0};
  const std::vector<int64_t> snap_cu = {0, 3, 3, 5, 6};
  const std::vector<int64_t> offsets = {64, 192, 200, 128, 130, 64};
  const SnapshotRun want =
      RunWithSnapshots(variant(), ZeroFreshStates(p, has_init), {{64, 192, 200}, {}, {128, 130}, {64}});
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  std::vector<float> pool(6 * per, kSentinel);
  for (int64_t n = 0; n < p.N; ++n) {
    if (idx[n] > 0) std::copy_n(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, pool.begin() + idx[n] * per);
  }
  std::vector<float> snaps(offsets.size() * per, kSentinel);
  std::vector<float*> dst;
  for (size_t j = 0; j < offsets.size(); ++j) dst.push_back(snaps.data() + j * per);
  const Typed q(p.q, DType::kF32), g(p.g, DType::kF32), beta(p.beta, DType::kF32);
  const Typed k(p.k, DType::kF32), v(p.v, DType::kF32);
  Typed o(p.q.size(), DType::kF32, kSentinel);
  ChunkKdaArgs a;
  a.o = o.Mut();
  a.q = q.Const();
  a.k = k.Const();
  a.v = v.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.state = pool.data();
  a.state_indices = idx.data();
  a.num_states = 6;
  a.has_initial_state = has_init.data();
  a.snapshot_cu = snap_cu.data();
  a.snapshot_offsets = offsets.data();
  a.snapshot_states = dst.data();
  a.T = p.T;
  a.N = p.N;
  a.H = p.H;
  a.K = a.V = p.K;
  a.options = p.Options();
  ChunkFn(variant())(a);
  EXPECT_TRUE(BitEqual(snaps.data(), want.snapshots.data(), snaps.size()));
}

TEST_P(KdaChunkTest, SnapshotOffsetsAreValidated) {
  Spec s;
  s.lengths = {130, 40};
  s.H = 1;
  s.K = 16;
  const Problem p = MakeProblem(s);
  for (const auto& bad : std::vector<std::vector<std::vector<int64_t>>>{
           {{63}, {}}, {{128, 64}, {}}, {{0}, {}}, {{192}, {}}, {{}, {41}}, {{64, 64}, {}}}) {
    EXPECT_THROW(RunWithSnapshots(variant(), p, bad), Error);
  }
  EXPECT_NO_THROW(RunWithSnapshots(variant(), p, {{64, 128, 130}, {40}}));
}

INSTANTIATE_TEST_SUITE_P(Kda, KdaChunkTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// ------------------------------------------------- recurrent kernels (decode)

class KdaRecurrentTest : public VariantTest {};

TEST_P(KdaRecurrentTest, PaddingWritesZerosAndTouchesNoState) {
  // Mixed padding / live entries in one call, on the parallel path.
  const int h = 2, kd = 32;
  const size_t hk = static_cast<size_t>(h) * kd;
  const size_t per_state = hk * kd;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  auto random = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = 0.3F * normal(rng);
    return x;
  };
  const std::vector<float> q = random(4 * hk), k = random(4 * hk), v = random(4 * hk);
  std::vector<float> g = random(4 * hk);
  for (float& e : g) e = -std::fabs(e);
  const std::vector<float> beta(4 * h, 0.5F);
  const std::vector<float> states0 = random(4 * per_state);
  const std::vector<int32_t> idx = {2, -1, 0, -7};
  const Typed tq(q, DType::kF32), tk(k, DType::kF32), tv(v, DType::kF32), tg(g, DType::kF32), tb(beta, DType::kF32);
  auto run = [&](const Variant& variant, std::vector<float>& states) {
    Typed o(4 * hk, DType::kF32, kSentinel);
    RecurrentKdaArgs a;
    a.o = o.Mut();
    a.state = states.data();
    a.state_indices = idx.data();
    a.num_states = 4;
    a.q = tq.Const();
    a.k = tk.Const();
    a.v = tv.Const();
    a.g = tg.Const();
    a.beta = tb.Const();
    a.N = 4;
    a.H = h;
    a.K = a.V = kd;
    RecurrentFn(variant)(a);
    return o.ToF32();
  };
  std::vector<float> states = states0;
  const std::vector<float> o = run(variant(), states);
  // Entries 1 and 3 are padding: zero outputs, their slots (1, 3) untouched;
  // the live entries write outputs and update slots 2 and 0.
  for (size_t i = 0; i < hk; ++i) {
    EXPECT_EQ(o[hk + i], 0.0F);
    EXPECT_EQ(o[3 * hk + i], 0.0F);
    EXPECT_NE(o[i], kSentinel);
    EXPECT_NE(o[2 * hk + i], kSentinel);
  }
  for (int slot : {1, 3}) {
    EXPECT_TRUE(BitEqual(states.data() + slot * per_state, states0.data() + slot * per_state, per_state))
        << "slot " << slot;
  }
  for (int slot : {0, 2}) {
    EXPECT_FALSE(BitEqual(states.data() + slot * per_state, states0.data() + slot * per_state, per_state))
        << "slot " << slot;
  }
  // The live entries against the chunk reference, one token each.
  for (int64_t n : {0, 2}) {
    Problem p;
    p.T = p.N = 1;
    p.H = h;
    p.K = kd;
    p.cu = {0, 1};
    const auto row = static_cast<std::ptrdiff_t>(n * hk);
    const auto hk_d = static_cast<std::ptrdiff_t>(hk);
    p.q.assign(q.begin() + row, q.begin() + row + hk_d);
    p.k.assign(k.begin() + row, k.begin() + row + hk_d);
    p.v.assign(v.begin() + row, v.begin() + row + hk_d);
    p.g.assign(g.begin() + row, g.begin() + row + hk_d);
    p.beta.assign(2, 0.5F);
    const size_t slot = static_cast<size_t>(idx[n]) * per_state;
    p.h0.assign(states0.begin() + static_cast<std::ptrdiff_t>(slot),
                states0.begin() + static_cast<std::ptrdiff_t>(slot + per_state));
    const Result want = RunChunk(kReference, p);
    EXPECT_TRUE(AllCloseF32(o.data() + n * hk, want.o.data(), hk)) << "entry " << n;
    EXPECT_TRUE(AllCloseF32(states.data() + slot, want.state.data(), per_state)) << "entry " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Kda, KdaRecurrentTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

}  // namespace
}  // namespace kda
