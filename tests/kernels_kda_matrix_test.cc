// The KDA core kernels over the kernel matrix (tests/kernel_matrix.h): chunk
// (prefill) and recurrent (decode) kernels x {reference, optimized in every
// ISA the CPU supports}, each edge case written once. A chunk kernel is
// checked against the recurrent reference run token by token, a recurrent
// kernel against the chunk reference (independent implementations of one
// function, design §2.5 and §3), both against a float64 recurrence; then
// state layout and semantics (aliasing, empty sequences, padding, causality,
// split prefills, thread-count independence, aligned and unaligned outputs).
// Every call is a ChunkKdaCall / RecurrentKdaCall bound by BindChunkKda /
// BindRecurrentKda and run by the variant's implementation.
// Test names: Kda/<Suite>.<Case>/<kernel>_<impl>[_<isa>].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/base/f16.h"
#include "kda/base/parallel.h"
#include "kda/kernels/chunk_kda_reference.h"
#include "kda/kernels/fused_recurrent_kda_reference.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kda_gate.h"
#include "kda/kernels/kda_optimized.h"
#include "kda/kernels/kernel_isa.h"
#include "tests/error_util.h"
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
using testing::ChunkCallFor;
using testing::ChunkRun;
using testing::DecodeCallFor;
using testing::Describe;
using testing::ExpectBitEqual;
using testing::ExpectClose;
using testing::GateKind;
using testing::kSentinel;
using testing::MakeProblem;
using testing::NaiveRecurrenceF64;
using testing::NormalizeRows;
using testing::Problem;
using testing::Result;
using testing::RoundedOnce;
using testing::RoundInputsTo;
using testing::SetStates;
using testing::Spec;
using testing::Typed;
using testing::TypedInputs;
using testing::Variant;
using testing::VariantName;
using testing::VariantParamName;
using testing::VariantScope;
using testing::VariantTest;

using testing::ThreadScope;

constexpr GateKind kMild = GateKind::kMild;
constexpr GateKind kStress = GateKind::kStress;

void (*ChunkFn(const Variant& v))(const ChunkKdaArgs&) {
  return v.optimized() ? &chunk_kda_optimized : &chunk_kda_reference;
}
void (*RecurrentFn(const Variant& v))(const RecurrentKdaArgs&) {
  return v.optimized() ? &fused_recurrent_kda_optimized : &fused_recurrent_kda_reference;
}

// The call bound and run by the variant's chunk implementation.
void RunChunkCall(const Variant& v, const ChunkKdaCall& c) { ChunkFn(v)(BindChunkKda(c)); }

Result RunChunk(const Variant& v, const Problem& p, const ChunkRun& run = {}) {
  return testing::RunChunkWith(p, ChunkFn(v), run);
}

// Token by token: step t runs every sequence that has a token t, the others
// are padding (index -1); sequence n lives in slot n + 1 of the state buffer,
// slot 0 is never touched. Hundreds of tiny kernel calls: when test processes
// oversubscribe the cores (ctest -j), each OpenMP region can cost a scheduler
// time slice, so this runs on one thread unless `threads` says otherwise (the
// parallel path is covered by the thread-count and padding cases).
Result RunDecode(const Variant& v, const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32, int threads = 1,
                 int64_t fused_pad = -1) {
  const ThreadScope scope(threads);
  return testing::RunTokenByToken(p, RecurrentFn(v), qkv, gb, fused_pad);
}

const Variant kReference{KernelImpl::kReference, KernelIsa::kAuto};

// The dtype rule: a run with q/k/v/o in dt is the fp32 run on the same input
// values, its states identical and its output rounded once.
void ExpectFp32RunRounded(const Result& got, const Result& f32, DType dt) {
  ASSERT_EQ(got.o.size(), f32.o.size());
  ASSERT_EQ(got.state.size(), f32.state.size());
  EXPECT_TRUE(BitEqual(got.state.data(), f32.state.data(), f32.state.size())) << "states";
  for (size_t i = 0; i < f32.o.size(); ++i) ASSERT_EQ(got.o[i], RoundedOnce(dt, f32.o[i])) << "output " << i;
}

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
  // fused_pad >= 0: q, k, v as slices of a fused projection (testing::FusedQkv).
  Result Run(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32, int threads = 1,
             int64_t fused_pad = -1) const {
    if (!chunk()) return RunDecode(variant(), p, qkv, gb, threads, fused_pad);
    const ThreadScope scope(threads);
    return RunChunk(variant(), p, {.qkv = qkv, .gb = gb, .fused_pad = fused_pad});
  }
  // The independent reference: the recurrent one for chunk kernels, the chunk one for recurrent kernels.
  Result Oracle(const Problem& p, DType qkv = DType::kF32, DType gb = DType::kF32) const {
    if (!chunk()) return RunChunk(kReference, p, {.qkv = qkv, .gb = gb});
    return RunDecode(kReference, p, qkv, gb);
  }
  // p's inputs rounded to dt, then the fp32 run and the run with q/k/v/o, g and beta in dt: the same fp32
  // arithmetic on the same values, so the latter is the former with its output rounded once
  // (ExpectFp32RunRounded).
  void RunRoundedInputs(Problem& p, DType dt, Result& f32, Result& low) const {
    RoundInputsTo(p, dt);
    f32 = Run(p);
    low = Run(p, dt, dt);
    ExpectFp32RunRounded(low, f32, dt);
  }
  // Half-precision storage of everything (RunRoundedInputs), the fp32 run against the float64 recurrence, and with
  // g and beta alone in dt (the same values) the fp32 output.
  void CheckHalfPrecision(const Spec& s, DType dt) const {
    SCOPED_TRACE(Describe(s) + " " + DTypeName(dt));
    Problem p = MakeProblem(s);
    Result f32, half;
    ASSERT_NO_FATAL_FAILURE(RunRoundedInputs(p, dt, f32, half));
    ExpectClose(f32, NaiveRecurrenceF64(p));
    ExpectClose(Run(p, DType::kF32, dt), f32);
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

// The in-kernel L2 norm and gate over ragged batches (mild and stress raw
// gates), and the norm alone at K = 128.
std::vector<Spec> InKernelSpecs() {
  std::vector<Spec> r;
  for (GateKind gate : {kMild, kStress}) {
    r.push_back({.lengths = kRagged,
                 .H = 2,
                 .K = 64,
                 .gate = gate,
                 .l2norm_in_kernel = true,
                 .gate_in_kernel = true,
                 .seed = gate == kMild ? 51U : 52U});
  }
  r.push_back({.lengths = {0, 1, 50, 77}, .H = 2, .K = 128, .l2norm_in_kernel = true, .seed = 41});
  return r;
}

// A problem checked against the oracle, and what it covers.
struct OracleCase {
  std::string what;
  Spec spec;
};

std::vector<OracleCase> OracleCases() {
  std::vector<OracleCase> r;
  uint32_t seed = 10;
  for (int h : {1, 3}) {
    for (int k : {64, 128}) {
      for (bool init : {false, true}) {
        r.push_back({"ragged batch", {.lengths = kRagged, .H = h, .K = k, .initial_state = init, .seed = ++seed}});
      }
    }
  }
  // Gates down to -250 per step: decays underflow to exactly 0.
  r.push_back({"stress gates", {.lengths = {1, 64, 70, 200, 260}, .H = 2, .K = 128, .gate = kStress, .seed = 31}});
  r.push_back(
      {"stress gates, an explicit scale instead of K^-0.5",
       {.lengths = kRagged, .H = 2, .K = 64, .gate = kStress, .initial_state = false, .scale = 0.3F, .seed = 32}});
  // Hundreds of tokens: the optimized prefill's scaled state rows are
  // materialised many times (mild gates reach the 2^-64 threshold after ~1000
  // steps in the slow dimensions, stress gates at every -250 step).
  for (GateKind gate : {kMild, kStress}) {
    r.push_back(
        {"long sequence", {.lengths = {1100}, .H = 1, .K = 128, .gate = gate, .seed = gate == kMild ? 221U : 222U}});
  }
  // Head dims 16, 32: one or two registers of columns; 48, 80: a partial
  // column block after full ones; 256: the largest head dim.
  seed = 240;
  for (int k : {16, 32, 48, 80, 256}) {
    const std::vector<int64_t> lengths = k == 256 ? std::vector<int64_t>{5, 40} : std::vector<int64_t>{3, 0, 64, 100};
    r.push_back({"head dim", {.lengths = lengths, .H = 2, .K = k, .gate = kStress, .seed = ++seed}});
  }
  // Enough (sequence, head) pairs for the optimized prefill to run heads in
  // lockstep groups (including a partial last group: H = 10), two token blocks.
  r.push_back({"head groups", {.lengths = {40, 1, 0, 75}, .H = 10, .K = 64, .gate = kStress, .seed = 225}});
  // g = 0: the row scales stay exactly 1.
  r.push_back({"without decay", {.lengths = {40, 3}, .H = 2, .K = 32, .gate = GateKind::kNone, .seed = 231}});
  // The in-kernel norm and gate (see InKernelNormAndGateEqualPreprocessing).
  for (const Spec& s : InKernelSpecs()) r.push_back({"in-kernel norm and gate", s});
  return r;
}

TEST_P(KdaKernelTest, MatchesOracle) {
  for (const OracleCase& c : OracleCases()) {
    SCOPED_TRACE(c.what);
    CheckAgainstOracle(c.spec);
  }
}

TEST_P(KdaKernelTest, InKernelNormAndGateEqualPreprocessing) {
  const std::vector<Spec> specs = InKernelSpecs();
  for (const Spec& s : specs) {
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    Problem pre = p;
    if (p.gate_in_kernel) {
      // The in-kernel gate equals the pre-activated gate.
      pre.gate_in_kernel = false;
      for (size_t i = 0; i < pre.g.size(); ++i) {
        const size_t c = i % (static_cast<size_t>(p.H) * p.K);  // channel h * K + d
        pre.g[i] = KdaGate(p.g[i] + p.dt_bias[c], p.a_log[c / p.K]);
      }
    } else {
      // The norm alone equals normalising beforehand (in double here).
      pre.l2norm_in_kernel = false;
      NormalizeRows(pre.q, pre.K);
      NormalizeRows(pre.k, pre.K);
    }
    ExpectClose(Run(p), Run(pre));
  }
}

TEST_P(KdaKernelTest, Bf16Inputs) {
  for (int k : {64, 128}) {
    const Spec s{.lengths = {0, 1, 33, 65, 100},
                 .H = 2,
                 .K = k,
                 .gate = kStress,
                 .l2norm_in_kernel = k == 128,
                 .seed = static_cast<uint32_t>(260 + k)};
    SCOPED_TRACE(Describe(s));
    Problem p = MakeProblem(s);
    // bf16 storage of the same values runs the same fp32 arithmetic: the state
    // is identical to the fp32 run's, the output is the fp32 output rounded once.
    Result f32, bf16;
    ASSERT_NO_FATAL_FAILURE(RunRoundedInputs(p, DType::kBF16, f32, bf16));
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

TEST_P(KdaKernelTest, MatchesFloat64Recurrence) {
  for (bool in_kernel : {false, true}) {
    const Spec s{.lengths = {5, 0, 70},
                 .H = 2,
                 .K = 16,
                 .gate = kStress,
                 .l2norm_in_kernel = in_kernel,
                 .gate_in_kernel = in_kernel,
                 .seed = 71};
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    ExpectClose(Run(p), NaiveRecurrenceF64(p));
  }
}

// fla's options beyond Kimi-Linear's configuration (design of the call in
// kda/kernels/kda_args.h), each against the float64 recurrence: grouped value
// heads, head dims off the register width and K != V (the optimized kernels'
// zero-padded tails), beta logits (2 sigmoid with allow_neg_eigval), the
// sigmoid gate with a lower bound (with and without A_log), V-first states,
// per-value beta (recurrent kernel only).
std::vector<Spec> FlaOptionSpecs(bool recurrent) {
  std::vector<Spec> r = {
      {.lengths = {5, 0, 40}, .H = 1, .K = 32, .gate = kStress, .seed = 601, .HV = 3},
      {.lengths = {3, 37}, .H = 2, .K = 60, .l2norm_in_kernel = true, .seed = 602, .V = 100},
      {.lengths = {1, 33}, .H = 2, .K = 100, .gate = kStress, .gate_in_kernel = true, .seed = 603, .V = 60},
      {.lengths = {70}, .H = 1, .K = 100, .seed = 604, .V = 100},
      {.lengths = {1, 9, 33}, .H = 2, .K = 5, .gate = kStress, .seed = 605, .HV = 4, .V = 3},
      {.lengths = {2, 35}, .H = 2, .K = 32, .seed = 606, .beta_sigmoid = true},
      {.lengths = {2, 35}, .H = 2, .K = 32, .seed = 607, .beta_sigmoid = true, .allow_neg_eigval = true},
      {.lengths = {4, 66}, .H = 2, .K = 32, .gate = kStress, .gate_in_kernel = true, .seed = 608, .lower_bound = -5.0F},
      {.lengths = {4, 40},
       .H = 1,
       .K = 24,
       .gate_in_kernel = true,
       .seed = 609,
       .lower_bound = -3.0F,
       .no_a_log = true},
      {.lengths = {0, 6, 45}, .H = 2, .K = 24, .gate = kStress, .seed = 610, .V = 40, .state_v_first = true},
      {.lengths = {3, 50},
       .H = 2,
       .K = 48,
       .gate = kStress,
       .l2norm_in_kernel = true,
       .gate_in_kernel = true,
       .seed = 611,
       .HV = 4,
       .V = 80,
       .beta_sigmoid = true,
       .allow_neg_eigval = true,
       .lower_bound = -4.0F,
       .state_v_first = true},
  };
  if (recurrent) {
    r.push_back(
        {.lengths = {2, 30}, .H = 1, .K = 20, .gate = kStress, .seed = 612, .HV = 2, .V = 36, .beta_per_value = true});
    r.push_back({.lengths = {7}, .H = 2, .K = 16, .seed = 613, .beta_sigmoid = true, .beta_per_value = true});
  }
  return r;
}

TEST_P(KdaKernelTest, FlaOptionsMatchFloat64Recurrence) {
  for (const Spec& s : FlaOptionSpecs(!chunk())) {
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    ExpectClose(Run(p), NaiveRecurrenceF64(p));
  }
}

// Without the delta correction (KdaOptions::delta_correction false): the plain
// gated linear recurrence of Mamba2's SSD, k = B and q = C of G groups shared
// by the value heads, v = x, beta = dt, a scalar log decay dt A per head and
// token, scale 1, states [N, H, P, N_state] (V-first), against the float64
// recurrence: the shapes of Granite-4.0-H (G 1, N_state 128, P 64), groups of
// several heads, the kernels' padded tails, stress and loud decays, prefills
// split at odd points and batches of one-token sequences.
std::vector<Spec> PlainRecurrenceSpecs() {
  std::vector<Spec> r;
  const auto add = [&](Spec s, bool skip = false) {
    s.scale = 1.0F;
    s.scalar_gate = true;
    s.state_v_first = true;
    s.delta_correction = false;
    s.skip = skip;
    r.push_back(s);
  };
  add({.lengths = {5, 0, 70, 130}, .H = 1, .K = 32, .gate = GateKind::kStress, .seed = 701, .HV = 8, .V = 32});
  add({.lengths = {1, 64, 65}, .H = 2, .K = 16, .initial_state = false, .seed = 702, .HV = 8, .V = 48});
  add({.lengths = {200}, .H = 1, .K = 128, .gate = GateKind::kLoud, .seed = 703, .HV = 2, .V = 64});
  add({.lengths = {1, 1, 1, 3}, .H = 2, .K = 20, .gate = GateKind::kStress, .seed = 704, .HV = 4, .V = 36});
  add({.lengths = {37, 60}, .H = 1, .K = 64, .gate = GateKind::kNone, .seed = 705, .HV = 3, .V = 24});
  // Mamba2's skip o + D v in the kernels (KdaOptions::D): prefill, decode tokens, a V tail; and K-major states.
  add({.lengths = {5, 0, 70, 1}, .H = 1, .K = 32, .gate = kStress, .seed = 706, .HV = 8, .V = 36}, true);
  add({.lengths = {1, 1, 3, 40}, .H = 2, .K = 16, .gate = GateKind::kLoud, .seed = 707, .HV = 4, .V = 64}, true);
  r.push_back(r.back());
  r.back().state_v_first = false;
  r.back().seed = 708;
  // fla's options on the same recurrence (the in-kernel norm, gate and beta sigmoid), and 80 value heads of one
  // key head (the chunked SSD prefill splits them into several tasks, kc::kSsdMaxHeads at most each).
  add({.lengths = {3, 70},
       .H = 2,
       .K = 24,
       .gate = kStress,
       .l2norm_in_kernel = true,
       .gate_in_kernel = true,
       .seed = 709,
       .HV = 4,
       .V = 40,
       .beta_sigmoid = true});
  add({.lengths = {45, 2}, .H = 1, .K = 16, .gate = GateKind::kLoud, .seed = 710, .HV = 80, .V = 8}, true);
  return r;
}

TEST_P(KdaKernelTest, PlainRecurrenceMatchesFloat64Recurrence) {
  for (const Spec& s : PlainRecurrenceSpecs()) {
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    ExpectClose(Run(p), NaiveRecurrenceF64(p));
  }
}

// float16 inputs and outputs: the same fp32 arithmetic on the fp16 values
// (the state identical to the fp32 run's), the output rounded once.
TEST_P(KdaKernelTest, F16Inputs) {
  const std::vector<Spec> specs = {
      {.lengths = {0, 1, 33, 65}, .H = 2, .K = 64, .gate = kStress, .l2norm_in_kernel = true, .seed = 621},
      {.lengths = {3, 40}, .H = 1, .K = 100, .gate = kStress, .seed = 622, .HV = 2, .V = 60},
  };
  for (const Spec& s : specs) ASSERT_NO_FATAL_FAILURE(CheckHalfPrecision(s, DType::kF16));
}

// q, k, v read in place as token-strided slices of one fused projection
// (engines' qkv = x W^T): the same bits as contiguous q, k, v, in every dtype,
// with grouped value heads, head dim tails, unaligned rows (odd pads) and
// several threads (the prefill's task splits and prefetch lists).
TEST_P(KdaKernelTest, TokenStridedQkvGiveTheSameBits) {
  const std::vector<Spec> specs = {
      {.lengths = {0, 1, 33, 65}, .H = 2, .K = 64, .gate = kStress, .l2norm_in_kernel = true, .seed = 651},
      {.lengths = {3, 40}, .H = 1, .K = 100, .gate = kStress, .gate_in_kernel = true, .seed = 652, .HV = 2, .V = 60},
      {.lengths = {5, 0, 70},
       .H = 2,
       .K = 24,
       .gate = kStress,
       .seed = 653,
       .HV = 4,
       .V = 40,
       .beta_sigmoid = true,
       .state_v_first = true},
  };
  for (const Spec& s : specs) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(Describe(s) + " " + DTypeName(dt));
      Problem p = MakeProblem(s);
      RoundInputsTo(p, dt);
      for (int threads : {1, 3}) {
        const Result want = Run(p, dt, dt, threads);
        for (int64_t pad : {0, 7}) ExpectBitEqual(Run(p, dt, dt, threads, pad), want);
      }
    }
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
  p.HV = p.H;
  p.V = p.K;
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
    const Spec s{.lengths = h == 16 ? std::vector<int64_t>{70, 0, 33, 5} : std::vector<int64_t>{70},
                 .H = h,
                 .K = h == 16 ? 32 : 128,
                 .gate = kStress,
                 .seed = static_cast<uint32_t>(320 + h)};
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    const Result one = Run(p);
    for (int threads : {2, 3, 8}) ExpectBitEqual(Run(p, DType::kF32, DType::kF32, threads), one);
  }
}

// ------------------------------------------------- a scalar gate (Gated DeltaNet)

// Gated DeltaNet's gate: one decay per value head, g [T, HV], never broadcast
// over K. Grouped value heads 1..4 (Qwen3-Next 2, Qwen3.5-27B 3, Qwen3.5-397B 4)
// with K != V, loud gates (down to -60 per step, as the gdn-loud golden set:
// any factorised form overflows), stress gates (-250: decays underflow to 0),
// mild and no decay, the in-kernel gate (dt_bias [HV]), head dims off the
// register width, head groups, and hundreds of tokens (the optimized
// prefill's state materialised many times over).
std::vector<OracleCase> ScalarGateCases() {
  std::vector<OracleCase> r;
  uint32_t seed = 700;
  for (int m : {1, 2, 3, 4}) {
    r.push_back({"grouped value heads, loud gates",
                 {.lengths = kRagged,
                  .H = 2,
                  .K = 64,
                  .gate = GateKind::kLoud,
                  .initial_state = m % 2 == 0,
                  .seed = ++seed,
                  .HV = 2 * m,
                  .V = m == 3 ? 48 : 64,
                  .scalar_gate = true}});
  }
  for (GateKind gate : {kMild, kStress, GateKind::kNone}) {
    r.push_back(
        {"gate kinds",
         {.lengths = {1, 64, 70, 130}, .H = 2, .K = 128, .gate = gate, .seed = ++seed, .HV = 4, .scalar_gate = true}});
  }
  r.push_back({"in-kernel norm and gate",
               {.lengths = kRagged,
                .H = 2,
                .K = 64,
                .gate = GateKind::kLoud,
                .l2norm_in_kernel = true,
                .gate_in_kernel = true,
                .seed = ++seed,
                .HV = 6,
                .V = 32,
                .beta_sigmoid = true,
                .scalar_gate = true}});
  for (int k : {16, 48, 100, 256}) {
    const std::vector<int64_t> lengths = k == 256 ? std::vector<int64_t>{5, 40} : std::vector<int64_t>{3, 0, 64, 100};
    r.push_back({"head dim",
                 {.lengths = lengths,
                  .H = 1,
                  .K = k,
                  .gate = GateKind::kLoud,
                  .seed = ++seed,
                  .HV = 2,
                  .V = k == 100 ? 60 : k,
                  .scalar_gate = true}});
  }
  r.push_back(
      {"head groups",
       {.lengths = {40, 1, 0, 75}, .H = 5, .K = 32, .gate = kStress, .seed = ++seed, .HV = 10, .scalar_gate = true}});
  for (GateKind gate : {kMild, GateKind::kLoud}) {
    r.push_back({"long sequence",
                 {.lengths = {1100}, .H = 1, .K = 128, .gate = gate, .seed = ++seed, .HV = 2, .scalar_gate = true}});
  }
  return r;
}

TEST_P(KdaKernelTest, ScalarGateMatchesOracleAndFloat64Recurrence) {
  for (const OracleCase& c : ScalarGateCases()) {
    SCOPED_TRACE(c.what);
    SCOPED_TRACE(Describe(c.spec));
    const Problem p = MakeProblem(c.spec);
    const Result got = Run(p);
    ExpectClose(got, Oracle(p));
    if (p.T <= 300) ExpectClose(got, NaiveRecurrenceF64(p));  // (the long sequences: the oracle kernel alone)
  }
}

// The scalar gate is the per-dimension gate with g broadcast over K (and dt_bias
// likewise): the two paths of every kernel agree to the fp32 tolerance.
TEST_P(KdaKernelTest, ScalarGateEqualsItsBroadcastOverK) {
  for (bool in_kernel : {false, true}) {
    const Spec s{.lengths = {0, 1, 33, 65, 130},
                 .H = 2,
                 .K = 48,
                 .gate = GateKind::kLoud,
                 .gate_in_kernel = in_kernel,
                 .seed = 740,
                 .HV = 6,
                 .V = 40,
                 .scalar_gate = true};
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    Problem wide = p;
    wide.scalar_gate = false;
    wide.g.clear();
    for (float g : p.g) wide.g.insert(wide.g.end(), static_cast<size_t>(p.K), g);
    if (in_kernel) {
      wide.dt_bias.clear();
      for (float b : p.dt_bias) wide.dt_bias.insert(wide.dt_bias.end(), static_cast<size_t>(p.K), b);
    }
    ExpectClose(Run(p), Run(wide));
  }
}

// bfloat16 and float16 storage with a scalar gate: the fp32 run on the same
// values, its state identical and its output rounded once; with g and beta alone
// in half precision, the fp32 output.
TEST_P(KdaKernelTest, ScalarGateInHalfPrecision) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const Spec s{.lengths = {0, 1, 33, 100},
                 .H = 2,
                 .K = 64,
                 .gate = GateKind::kLoud,
                 .l2norm_in_kernel = true,
                 .seed = 750,
                 .HV = 6,
                 .V = 32,
                 .scalar_gate = true};
    ASSERT_NO_FATAL_FAILURE(CheckHalfPrecision(s, dt));
  }
}

// Token-strided q, k, v (a fused projection's columns) and every thread split
// give the bits of the contiguous one-thread run.
TEST_P(KdaKernelTest, ScalarGateGivesTheSameBitsStridedAndInEverySplit) {
  const Spec s{
      .lengths = {70, 0, 33, 5}, .H = 2, .K = 128, .gate = GateKind::kLoud, .seed = 760, .HV = 4, .scalar_gate = true};
  SCOPED_TRACE(Describe(s));
  const Problem p = MakeProblem(s);
  const Result one = Run(p);
  for (int threads : {2, 3, 8}) ExpectBitEqual(Run(p, DType::kF32, DType::kF32, threads), one);
  for (int64_t pad : {0, 7}) ExpectBitEqual(Run(p, DType::kF32, DType::kF32, 3, pad), one);
}

INSTANTIATE_TEST_SUITE_P(Kda, KdaKernelTest, ::testing::ValuesIn(AllKdaParams()), KdaParamName);

// ------------------------------------------------- chunk kernels (prefill)

class KdaChunkTest : public VariantTest {
 protected:
  Result Run(const Problem& p, const ChunkRun& run = {}) const { return RunChunk(variant(), p, run); }
};

// The state layouts the chunk kernels' state cases (aliasing, empty
// sequences, has_initial_state, the pool form and its padding) run in:
// Kimi-Linear's head shape (HV = H, K = V, K-major states) in fp32, and fla's
// others: grouped value heads with K != V in V-first states and float16
// tokens, and grouped value heads with V = 24 (K != V) in K-major states and
// bfloat16; and Gated DeltaNet's (a gate per value head) with four value heads
// per key head, K != V, in bfloat16.
struct StateLayout {
  int group = 1;  // HV / H
  int v = 0;      // V (0: K)
  bool v_first = false;
  DType dtype = DType::kF32;  // q, k, v, o, g and beta (the inputs rounded to it)
  bool scalar_gate = false;   // g [T, HV] (GDN)
};
const StateLayout kStateLayouts[] = {
    {1, 0, false, DType::kF32},
    {3, 40, true, DType::kF16},
    {2, 24, false, DType::kBF16},
    {4, 40, false, DType::kBF16, true},
};

std::string LayoutName(const StateLayout& l) {
  return "HV = " + std::to_string(l.group) + " H, V = " + (l.v > 0 ? std::to_string(l.v) : std::string("K")) +
         (l.v_first ? ", V-first, " : ", K-major, ") + DTypeName(l.dtype) + (l.scalar_gate ? ", scalar gate" : "");
}

// The problem of spec s in layout l, its inputs rounded to l's dtype.
Problem LayoutProblem(Spec s, const StateLayout& l) {
  s.HV = s.H * l.group;
  s.V = l.v;
  s.state_v_first = l.v_first;
  s.scalar_gate = l.scalar_gate;
  Problem p = MakeProblem(s);
  RoundInputsTo(p, l.dtype);
  return p;
}

TEST_P(KdaChunkTest, AliasedInitialAndFinalStateMatchSeparate) {
  // In every state layout: the same bits as separate buffers; in fp32 against
  // the float64 recurrence, in half precision the fp32 run rounded once.
  for (const StateLayout& l : kStateLayouts) {
    SCOPED_TRACE(LayoutName(l));
    const Problem p = LayoutProblem({.lengths = {0, 65, 1, 0, 130}, .H = 2, .K = 64, .gate = kStress, .seed = 281}, l);
    const Result aliased = Run(p, {.qkv = l.dtype, .gb = l.dtype, .alias = true});
    ExpectBitEqual(aliased, Run(p, {.qkv = l.dtype, .gb = l.dtype}));
    const Result f32 = l.dtype == DType::kF32 ? aliased : Run(p, {.alias = true});
    ExpectFp32RunRounded(aliased, f32, l.dtype);
    ExpectClose(f32, NaiveRecurrenceF64(p));
  }
}

TEST_P(KdaChunkTest, EmptySequencesKeepTheirStateExactly) {
  for (const StateLayout& l : kStateLayouts) {
    SCOPED_TRACE(LayoutName(l));
    const Problem p = LayoutProblem({.lengths = {0, 5, 0}, .H = 2, .K = 32, .seed = 291}, l);
    const size_t per_seq = static_cast<size_t>(p.HV) * p.HeadState();
    for (bool alias : {false, true}) {
      const Result r = Run(p, {.qkv = l.dtype, .gb = l.dtype, .alias = alias});
      for (int64_t n : {0, 2}) {
        EXPECT_TRUE(BitEqual(r.state.data() + n * per_seq, p.h0.data() + n * per_seq, per_seq))
            << "sequence " << n << (alias ? " (aliased)" : "");
      }
    }
    // A null initial state is zero.
    Problem no_h0 = p;
    no_h0.h0.clear();
    const Result r = Run(no_h0, {.qkv = l.dtype, .gb = l.dtype});
    for (int64_t n : {0, 2}) {
      for (size_t i = 0; i < per_seq; ++i) ASSERT_EQ(r.state[n * per_seq + i], 0.0F);
    }
  }
}

TEST_P(KdaChunkTest, EmptyBatchCopiesInitialState) {
  // T = 0: no token buffers at all (null views of shape [1, 0, H, K]); final state = initial state.
  const std::vector<int64_t> cu = {0, 0, 0};
  std::vector<float> h0(2 * 16 * 16);
  for (size_t i = 0; i < h0.size(); ++i) h0[i] = static_cast<float>(i) - 100.0F;
  std::vector<float> final_state(h0.size(), kSentinel);
  ChunkKdaCall c = testing::NullTokenCall<ChunkKdaCall>(1, 0, 1, 16);
  c.o = ContiguousView<void*>(nullptr, DType::kF32, {1, 0, 1, 16});
  c.cu_seqlens = ContiguousView<const void*>(cu.data(), DType::kI64, {3});
  c.initial_state = ContiguousView<const void*>(h0.data(), DType::kF32, {2, 1, 16, 16});
  c.output_final_state = true;
  c.final_state = ContiguousView<void*>(final_state.data(), DType::kF32, {2, 1, 16, 16});
  RunChunkCall(variant(), c);
  EXPECT_EQ(final_state, h0);
}

TEST_P(KdaChunkTest, NoFinalStateWhenNotRequested) {
  // Without output_final_state no final state buffer is passed; the outputs are unchanged.
  const Problem p = MakeProblem({.lengths = {3, 70}, .H = 1, .K = 16, .seed = 301});
  const Result want = Run(p);
  const Result r = Run(p, {.output_final_state = false});
  for (float x : r.state) ASSERT_EQ(x, kSentinel);
  EXPECT_TRUE(BitEqual(r.o.data(), want.o.data(), want.o.size()));
  // An initial state buffer is read, not written.
  const Result aliased = Run(p, {.alias = true, .output_final_state = false});
  EXPECT_TRUE(BitEqual(aliased.state.data(), p.h0.data(), p.h0.size()));
  EXPECT_TRUE(BitEqual(aliased.o.data(), want.o.data(), want.o.size()));
}

// The tokens [begin, begin + len) of a single-sequence problem.
Problem Slice(const Problem& p, int64_t begin, int64_t len) {
  Problem r = p;
  auto cut = [&](std::vector<float>& x, size_t row) {
    x = std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(begin * row),
                           x.begin() + static_cast<std::ptrdiff_t>((begin + len) * row));
  };
  cut(r.q, p.KeyRow());
  cut(r.k, p.KeyRow());
  cut(r.v, p.ValueRow());
  cut(r.g, p.GateRow());
  cut(r.beta, p.BetaRow());
  r.T = len;
  r.N = 1;
  r.cu = {0, len};
  return r;
}

TEST_P(KdaChunkTest, OutputsAreExactlyCausal) {
  // Token t's output must not depend on later tokens, not even at rounding level (design §8.3).
  const Problem p = MakeProblem({.lengths = {150}, .H = 2, .K = 32, .gate = kStress, .seed = 111});
  const Result full = Run(p);
  for (int64_t len : {1, 31, 33, 40, 64, 100}) {
    const Result part = Run(Slice(p, 0, len));
    EXPECT_TRUE(BitEqual(part.o.data(), full.o.data(), part.o.size())) << "prefix of " << len;
  }
}

// The first `split` tokens of a single-sequence problem p by the variant's
// chunk kernel, the rest by `rest` (carrying the state): equal to `full`
// within the fp32 tolerance (the reference's chunk boundaries move).
template <class RunRest>
void ExpectSplitMatches(const Variant& v, const Problem& p, int64_t split, const Result& full, const RunRest& rest) {
  SCOPED_TRACE("split at " + std::to_string(split));
  const Result first = RunChunk(v, Slice(p, 0, split));
  Problem tail = Slice(p, split, p.T - split);
  tail.h0 = first.state;
  const Result second = rest(tail);
  EXPECT_TRUE(AllCloseF32(first.o.data(), full.o.data(), first.o.size()));
  EXPECT_TRUE(AllCloseF32(second.o.data(), full.o.data() + first.o.size(), second.o.size()));
  EXPECT_TRUE(AllCloseF32(second.state.data(), full.state.data(), full.state.size()));
}

TEST_P(KdaChunkTest, SplitPrefillMatchesUnsplit) {
  // Prefill in two calls, carrying the state, equals one call.
  const Problem p = MakeProblem({.lengths = {150}, .H = 2, .K = 32, .seed = 121});
  const Result full = Run(p);
  for (int64_t split : {1, 50, 64, 129}) {
    ExpectSplitMatches(variant(), p, split, full, [&](const Problem& tail) { return Run(tail); });
  }
}

TEST_P(KdaChunkTest, PrefillThenDecodeMatchesOnePrefill) {
  // Prefill the first tokens with this variant's chunk kernel, decode the rest
  // with its recurrent kernel: equal to one reference prefill.
  const Problem p = MakeProblem({.lengths = {90}, .H = 2, .K = 128, .gate = kStress, .seed = 271});
  ExpectSplitMatches(variant(), p, 80, RunChunk(kReference, p),
                     [&](const Problem& tail) { return RunDecode(variant(), tail); });
}

TEST_P(KdaChunkTest, AlignedAndUnalignedOutputsGiveTheSameBits) {
  // Aligned output rows take the optimized prefill's streaming stores, others the plain ones.
  const Problem p = MakeProblem({.lengths = {0, 1, 37, 70}, .H = 3, .K = 64, .gate = kStress, .seed = 330});
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const Result want = Run(p, {.qkv = dt});
    for (int shift : {1, 8}) ExpectBitEqual(Run(p, {.qkv = dt, .out_shift = shift}), want);
  }
}

// ------------------------------------------------- pool form (state_indices) and snapshots

// NT: the chunks of chunk_size tokens of all of p's sequences.
int64_t NumChunks(const Problem& p, int chunk_size) {
  int64_t nt = 0;
  for (int64_t n = 0; n < p.N; ++n) nt += (p.cu[n + 1] - p.cu[n] + chunk_size - 1) / chunk_size;
  return nt;
}

// Mid-sequence state snapshots of a chunk_kda call: sequence n's at the
// offsets per_sequence[n], into `states` [total, HV, K, V] (kSentinel at first).
struct Snapshots {
  Snapshots(const Problem& p, const std::vector<std::vector<int64_t>>& per_sequence) {
    for (const auto& o : per_sequence) {
      offsets.insert(offsets.end(), o.begin(), o.end());
      cu.push_back(static_cast<int64_t>(offsets.size()));
    }
    const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
    states.assign(offsets.size() * per, kSentinel);
    for (size_t j = 0; j < offsets.size(); ++j) dst.push_back(states.data() + j * per);
  }
  Snapshots(const Snapshots&) = delete;
  Snapshots& operator=(const Snapshots&) = delete;
  void SetOn(ChunkKdaCall& c) const {
    c.snapshot_cu = cu.data();
    c.snapshot_offsets = offsets.data();
    c.snapshot_states = dst.data();
  }

  std::vector<int64_t> cu = {0};
  std::vector<int64_t> offsets;
  std::vector<float> states;
  std::vector<void*> dst;
};

// chunk_kda's outputs and its whole [S, HV, K, V] state pool after a pool-form call.
struct PoolResult {
  std::vector<float> o;
  std::vector<float> pool;
};

// chunk_kda in the pool form: sequence n in slot idx[n] (< 0: padding) of a
// pool of num_states slots, with `snapshots` when given, and with h given its
// intermediate states of chunk_size tokens (h [1, NT, HV, K, V] in qkv; V-first
// with state_v_first); q, k, v and o in qkv, g and beta in gb.
// Slots start as kSentinel; a sequence that reads its initial state (has_init
// empty or 1) finds p.h0[n] in its slot. Fresh sequences' slots keep the
// sentinel, which must never be read.
PoolResult RunChunkPool(const Variant& v, const Problem& p, const std::vector<int32_t>& idx,
                        const std::vector<uint8_t>& has_init, int64_t num_states, DType qkv = DType::kF32,
                        const Snapshots* snapshots = nullptr, int64_t fused_pad = -1, Typed* h = nullptr,
                        int chunk_size = 64, DType gb = DType::kF32) {
  const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
  PoolResult r;
  r.pool.assign(static_cast<size_t>(num_states) * per, kSentinel);
  for (int64_t n = 0; n < p.N; ++n) {
    if (idx[n] >= 0 && (has_init.empty() || has_init[n] != 0) && !p.h0.empty()) {
      std::copy_n(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, r.pool.begin() + idx[n] * per);
    }
  }
  const TypedInputs in(p, qkv, gb);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), qkv, kSentinel);
  ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
  c.state = testing::MutStatesView(p, r.pool.data(), num_states);
  c.state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {p.N});
  if (!has_init.empty()) c.has_initial_state = ContiguousView<const void*>(has_init.data(), DType::kU8, {p.N});
  if (snapshots != nullptr) snapshots->SetOn(c);
  if (h != nullptr) {
    c.chunk_size = chunk_size;
    c.return_intermediate_states = true;
    const int64_t nt = NumChunks(p, chunk_size);
    c.intermediate_states = p.state_v_first ? ContiguousView<void*>(h->Mut().data, qkv, {1, nt, p.HV, p.V, p.K})
                                            : ContiguousView<void*>(h->Mut().data, qkv, {1, nt, p.HV, p.K, p.V});
  }
  std::optional<testing::FusedQkv> fused;  // q, k, v as slices of a fused projection
  if (fused_pad >= 0) fused.emplace(c, fused_pad);
  RunChunkCall(v, c);
  r.o = o.ToF32();
  return r;
}

// p with the initial states of fresh sequences (has_init[n] == 0) zeroed.
Problem ZeroFreshStates(const Problem& p, const std::vector<uint8_t>& has_init) {
  const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
  Problem r = p;
  for (int64_t n = 0; n < p.N; ++n) {
    if (!has_init.empty() && has_init[n] == 0) {
      std::fill_n(r.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, 0.0F);
    }
  }
  return r;
}

// The pool-form call against the contiguous form of the same kernel (initial
// states of fresh sequences zeroed), bit for bit, with q, k, v, o, g and beta
// in dt: live sequences' outputs and final states (in their slots), padding
// outputs zero, every other slot untouched. In fp32 also against the float64
// recurrence; in half precision the fp32 pool-form run rounded once.
void ExpectPoolMatchesContiguous(const Variant& v, const Problem& p, const std::vector<int32_t>& idx,
                                 const std::vector<uint8_t>& has_init, int64_t num_states, DType dt = DType::kF32) {
  const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
  const size_t row = p.ValueRow();
  const Problem fresh_zeroed = ZeroFreshStates(p, has_init);
  const Result want = RunChunk(v, fresh_zeroed, {.qkv = dt, .gb = dt});
  const PoolResult got = RunChunkPool(v, p, idx, has_init, num_states, dt, nullptr, -1, nullptr, 64, dt);
  const PoolResult f32 = dt == DType::kF32 ? got : RunChunkPool(v, p, idx, has_init, num_states);
  const Result exact = NaiveRecurrenceF64(fresh_zeroed);
  std::vector<bool> used(static_cast<size_t>(num_states), false);
  for (int64_t n = 0; n < p.N; ++n) {
    SCOPED_TRACE("sequence " + std::to_string(n) + " slot " + std::to_string(idx[n]));
    const size_t rows = static_cast<size_t>(p.cu[n + 1] - p.cu[n]) * row;
    const float* o = got.o.data() + p.cu[n] * row;
    if (idx[n] < 0) {
      for (size_t i = 0; i < rows; ++i) ASSERT_EQ(o[i], 0.0F) << "padding output";
      continue;
    }
    used[idx[n]] = true;
    EXPECT_TRUE(BitEqual(o, want.o.data() + p.cu[n] * row, rows)) << "outputs";
    const float* slot = got.pool.data() + idx[n] * per;
    EXPECT_TRUE(BitEqual(slot, want.state.data() + n * per, per)) << "final state";
    EXPECT_TRUE(BitEqual(slot, f32.pool.data() + idx[n] * per, per)) << "final state against the fp32 run";
    const float* o32 = f32.o.data() + p.cu[n] * row;
    for (size_t i = 0; i < rows; ++i) ASSERT_EQ(o[i], RoundedOnce(dt, o32[i])) << "the fp32 output rounded, " << i;
    EXPECT_TRUE(AllCloseF32(o32, exact.o.data() + p.cu[n] * row, rows)) << "outputs against the float64 recurrence";
    EXPECT_TRUE(AllCloseF32(f32.pool.data() + idx[n] * per, exact.state.data() + n * per, per))
        << "final state against the float64 recurrence";
  }
  for (int64_t slot = 0; slot < num_states; ++slot) {
    if (used[slot]) continue;
    for (size_t i = 0; i < per; ++i) ASSERT_EQ(got.pool[slot * per + i], kSentinel) << "slot " << slot << " touched";
  }
}

TEST_P(KdaChunkTest, PoolFormMatchesContiguousForm) {
  // Permuted slots, fresh sequences (their slots hold sentinels), empty
  // sequences fresh and continuing; slots 0 and 4 belong to no sequence.
  for (const StateLayout& l : kStateLayouts) {
    SCOPED_TRACE(LayoutName(l));
    const Problem p =
        LayoutProblem({.lengths = {0, 5, 70, 33, 1, 0}, .H = 3, .K = 32, .gate = kStress, .seed = 401}, l);
    const std::vector<int32_t> idx = {3, 7, 1, 5, 2, 6};
    ExpectPoolMatchesContiguous(variant(), p, idx, {1, 0, 1, 1, 0, 0}, 8, l.dtype);
    ExpectPoolMatchesContiguous(variant(), p, idx, {}, 8, l.dtype);
  }
}

TEST_P(KdaChunkTest, PoolPaddingWritesZerosAndTouchesNoState) {
  // Padding sequences with and without tokens (indices -1 and -3), mixed with
  // live ones; slot 0, the dummy slot, is never used.
  for (const StateLayout& l : kStateLayouts) {
    SCOPED_TRACE(LayoutName(l));
    const Problem p = LayoutProblem({.lengths = {4, 0, 7, 3, 40}, .H = 2, .K = 16, .seed = 411}, l);
    ExpectPoolMatchesContiguous(variant(), p, {2, -1, 5, -3, 1}, {1, 1, 0, 1, 1}, 6, l.dtype);
  }
}

TEST_P(KdaChunkTest, PoolFormReadsTokenStridedQkv) {
  // The pool form with padding and fresh sequences, q, k, v slices of a fused
  // projection: the same bits as contiguous ones (bf16).
  Problem p = MakeProblem({.lengths = {70, 0, 5, 33}, .H = 2, .K = 32, .gate = kStress, .seed = 671});
  RoundInputsTo(p, DType::kBF16);
  const std::vector<int32_t> idx = {3, 0, -1, 1};
  const std::vector<uint8_t> has_init = {1, 0, 1, 0};
  const PoolResult want = RunChunkPool(variant(), p, idx, has_init, 5, DType::kBF16);
  for (int64_t pad : {0, 3}) {
    const PoolResult got = RunChunkPool(variant(), p, idx, has_init, 5, DType::kBF16, nullptr, pad);
    EXPECT_TRUE(BitEqual(got.o.data(), want.o.data(), want.o.size())) << "outputs, pad " << pad;
    EXPECT_TRUE(BitEqual(got.pool.data(), want.pool.data(), want.pool.size())) << "pool, pad " << pad;
  }
}

TEST_P(KdaChunkTest, PoolFormMatchesRecurrentReference) {
  // The pool form against the recurrent reference run token by token on the
  // contiguous problem (fresh states zeroed), fp32 and bf16 q/k/v/o.
  Problem p = MakeProblem(
      {.lengths = {130, 1, 0, 65, 33}, .H = 4, .K = 64, .gate = kStress, .l2norm_in_kernel = true, .seed = 421});
  RoundInputsTo(p, DType::kBF16);
  const std::vector<int32_t> idx = {4, 9, -1, 1, 6};
  const std::vector<uint8_t> has_init = {1, 0, 0, 1, 0};
  const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
  const size_t hk = p.ValueRow();
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

struct SnapshotRun {
  Result result;                 // outputs and final states ([N, HV, K, V], contiguous form)
  std::vector<float> snapshots;  // [snapshot_cu[N], HV, K, V]
};

// The kernel in the contiguous form (has_init: as has_initial_state, unless
// empty), with snapshots at offsets[n] of sequence n (none when empty), the
// initial state buffer also the final one with `alias`; q, k, v, o, g and beta in dt.
SnapshotRun RunContiguous(const Variant& v, const Problem& p, const std::vector<std::vector<int64_t>>& offsets,
                          const std::vector<uint8_t>& has_init = {}, bool alias = false, DType dt = DType::kF32) {
  const Snapshots snapshots(p, offsets);
  const TypedInputs in(p, dt, dt);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), dt, kSentinel);
  SnapshotRun r;
  r.result.state = alias ? p.h0 : std::vector<float>(p.StateSize(), kSentinel);
  ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
  SetStates(p, c, p.h0.empty() ? nullptr : (alias ? r.result.state.data() : p.h0.data()), r.result.state.data());
  if (!has_init.empty()) c.has_initial_state = ContiguousView<const void*>(has_init.data(), DType::kU8, {p.N});
  if (!offsets.empty()) snapshots.SetOn(c);
  RunChunkCall(v, c);
  r.result.o = o.ToF32();
  r.snapshots = snapshots.states;
  return r;
}

TEST_P(KdaChunkTest, HasInitialStateInContiguousForm) {
  // has_initial_state[n] == 0 starts sequence n from zeros whatever its
  // initial_state holds, aliased or not; same bits as a zeroed initial state.
  for (const StateLayout& l : kStateLayouts) {
    SCOPED_TRACE(LayoutName(l));
    const Problem p = LayoutProblem({.lengths = {5, 0, 40, 0}, .H = 2, .K = 32, .seed = 431}, l);
    const std::vector<uint8_t> has_init = {0, 0, 1, 1};
    const Result want = Run(ZeroFreshStates(p, has_init), {.qkv = l.dtype, .gb = l.dtype});
    for (bool alias : {false, true}) {
      SCOPED_TRACE(alias ? "aliased" : "separate");
      ExpectBitEqual(RunContiguous(variant(), p, {}, has_init, alias, l.dtype).result, want);
    }
  }
}

// Sequence n's first len tokens with its initial state, as a one-sequence problem.
Problem SequencePrefix(const Problem& p, int64_t n, int64_t len) {
  Problem r = Slice(p, p.cu[n], len);
  const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
  if (!p.h0.empty())
    r.h0.assign(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per),
                p.h0.begin() + static_cast<std::ptrdiff_t>((n + 1) * per));
  return r;
}

TEST_P(KdaChunkTest, SnapshotsMatchPrefixRunsAtRandomOffsets) {
  // The state after each requested offset, emitted in the one pass, against
  // the reference run over that prefix alone (fp32 state rule); the outputs
  // and final states are those of the run without snapshots, bit for bit.
  // Head groups (one thread) and value-column splits (eight threads, few pairs).
  std::mt19937 rng(1201);
  // ssd: Mamba2's recurrence (a scalar gate, no delta correction, the skip; the chunked form where the ISA has it).
  struct Case {
    int H, K, threads;
    GateKind gate;
    bool ssd = false;
  };
  for (const Case& c : {Case{3, 32, 1, kMild}, Case{2, 128, 8, kStress}, Case{4, 64, 3, kMild},
                        Case{2, 32, 3, GateKind::kLoud, true}}) {
    SCOPED_TRACE("H " + std::to_string(c.H) + " K " + std::to_string(c.K) + " threads " + std::to_string(c.threads) +
                 (c.ssd ? " ssd" : ""));
    const ThreadScope scope(c.threads);
    std::uniform_int_distribution<int64_t> len_dist(0, 330);
    // (A braced list is evaluated in order: the lengths first, then the seed.)
    Spec spec{.lengths = {len_dist(rng), 256, len_dist(rng), 0, 64, len_dist(rng)},
              .H = c.H,
              .K = c.K,
              .gate = c.gate,
              .seed = static_cast<uint32_t>(rng())};
    if (c.ssd) {
      spec.scale = 1.0F;
      spec.scalar_gate = true;
      spec.delta_correction = false;
      spec.skip = true;
      spec.HV = 3 * c.H;
      spec.V = 40;
    }
    const Problem p = MakeProblem(spec);
    std::vector<std::vector<int64_t>> offsets(static_cast<size_t>(p.N));
    std::bernoulli_distribution take(0.6);
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t len = p.cu[n + 1] - p.cu[n];
      for (int64_t off = kSnapshotGrain; off < len; off += kSnapshotGrain) {
        if (take(rng)) offsets[n].push_back(off);
      }
      if (len > 0 && (len % kSnapshotGrain != 0 || take(rng))) offsets[n].push_back(len);
    }
    const SnapshotRun got = RunContiguous(variant(), p, offsets);
    ExpectBitEqual(got.result, Run(p));
    const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
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
  const Problem p = MakeProblem({.lengths = {200, 7, 130, 64}, .H = 2, .K = 32, .seed = 1211});
  const std::vector<int32_t> idx = {2, -1, 4, 1};
  const std::vector<uint8_t> has_init = {0, 1, 1, 0};
  const std::vector<std::vector<int64_t>> offsets = {{64, 192, 200}, {}, {128, 130}, {64}};
  const SnapshotRun want = RunContiguous(variant(), ZeroFreshStates(p, has_init), offsets);
  const Snapshots got(p, offsets);
  RunChunkPool(variant(), p, idx, has_init, 6, DType::kF32, &got);
  EXPECT_TRUE(BitEqual(got.states.data(), want.snapshots.data(), got.states.size()));
}

TEST_P(KdaChunkTest, SnapshotOffsetsAreValidated) {
  const Problem p = MakeProblem({.lengths = {130, 40}, .H = 1, .K = 16});
  for (const auto& bad : std::vector<std::vector<std::vector<int64_t>>>{
           {{63}, {}}, {{128, 64}, {}}, {{0}, {}}, {{192}, {}}, {{}, {41}}, {{64, 64}, {}}}) {
    EXPECT_THROW(RunContiguous(variant(), p, bad), Error);
  }
  EXPECT_NO_THROW(RunContiguous(variant(), p, {{64, 128, 130}, {40}}));
  EXPECT_NO_THROW(RunContiguous(variant(), p, {{32, 96, 130}, {32}}));
}

// ------------------------------------------------- intermediate states

// A chunk_kda run with return_intermediate_states: h [1, NT, HV, K, V] (V-first
// with state_v_first) in q/k/v's dtype, read back as fp32. `rows` > 1 runs
// p's equal-length sequences as that many rows without cu_seqlens.
struct IntermediateRun {
  Result result;
  std::vector<float> h;
};
IntermediateRun RunIntermediate(const Variant& v, const Problem& p, int chunk_size, DType qkv = DType::kF32,
                                int64_t rows = 1) {
  const TypedInputs in(p, qkv, DType::kF32);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), qkv, kSentinel);
  const int64_t nt = NumChunks(p, chunk_size);
  Typed h(static_cast<size_t>(nt) * p.HV * p.HeadState(), qkv, kSentinel);
  std::vector<float> state(p.StateSize(), kSentinel);
  ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
  if (rows > 1) {
    c = testing::TokenCall<ChunkKdaCall>(p, in, o.Mut(), rows, p.T / rows);
  }
  SetStates(p, c, p.h0.empty() ? nullptr : p.h0.data(), state.data());
  c.chunk_size = chunk_size;
  c.return_intermediate_states = true;
  const int64_t nt_row = nt / rows;
  c.intermediate_states = p.state_v_first ? ContiguousView<void*>(h.Mut().data, qkv, {rows, nt_row, p.HV, p.V, p.K})
                                          : ContiguousView<void*>(h.Mut().data, qkv, {rows, nt_row, p.HV, p.K, p.V});
  RunChunkCall(v, c);
  return {{o.ToF32(), state}, h.ToF32()};
}

// The intermediate-state cases: lengths that are and are not multiples of the
// chunk size, empty sequences, initial states or none, grouped value heads,
// K != V, V-first states, the in-kernel options.
std::vector<Spec> IntermediateSpecs() {
  return {
      {.lengths = {64, 0, 100, 31, 129}, .H = 2, .K = 32, .gate = kStress, .seed = 1301},
      {.lengths = {33, 96}, .H = 1, .K = 40, .initial_state = false, .seed = 1302, .HV = 3, .V = 24},
      {.lengths = {0, 65, 7},
       .H = 2,
       .K = 24,
       .gate = kStress,
       .l2norm_in_kernel = true,
       .gate_in_kernel = true,
       .seed = 1303,
       .HV = 4,
       .V = 40,
       .state_v_first = true},
  };
}

TEST_P(KdaChunkTest, IntermediateStatesMatchFloat64Recurrence) {
  // h is the state before each chunk's first token (chunk 0: the initial
  // state, or zeros), against the float64 recurrence at the fp32 tolerance and
  // against the reference kernel; o and the final states are those of the run
  // without h, bit for bit.
  for (const Spec& s : IntermediateSpecs()) {
    const Problem p = MakeProblem(s);
    for (int cs : {32, 64}) {
      SCOPED_TRACE(Describe(s) + " chunk_size " + std::to_string(cs));
      const IntermediateRun got = RunIntermediate(variant(), p, cs);
      std::vector<float> want_h;
      const Result want = NaiveRecurrenceF64(p, cs, &want_h);
      ASSERT_EQ(got.h.size(), want_h.size());
      ASSERT_GT(got.h.size(), 0U);
      EXPECT_TRUE(testing::AllFinite(got.h));
      EXPECT_TRUE(testing::AllCloseStateF32(got.h.data(), want_h.data(), want_h.size())) << "h";
      ExpectClose(got.result, want);
      ExpectBitEqual(got.result, Run(p));
      const IntermediateRun ref = RunIntermediate(kReference, p, cs);
      EXPECT_TRUE(testing::AllCloseStateF32(got.h.data(), ref.h.data(), ref.h.size())) << "h against the reference";
    }
  }
}

TEST_P(KdaChunkTest, IntermediateStatesInHalfPrecisionAreTheFp32StatesRoundedOnce) {
  // h in k's dtype: the fp32 run's states on the same input values, rounded once.
  for (const Spec& s : IntermediateSpecs()) {
    SCOPED_TRACE(Describe(s));
    for (const auto& [dt, chunk_size] : {std::pair{DType::kBF16, 32}, std::pair{DType::kF16, 64}}) {
      SCOPED_TRACE(DTypeName(dt));
      Problem p = MakeProblem(s);
      RoundInputsTo(p, dt);
      const IntermediateRun half = RunIntermediate(variant(), p, chunk_size, dt);
      const IntermediateRun want = RunIntermediate(variant(), p, chunk_size);
      ASSERT_EQ(half.h.size(), want.h.size());
      for (size_t i = 0; i < want.h.size(); ++i) ASSERT_EQ(half.h[i], RoundedOnce(dt, want.h[i])) << i;
    }
  }
}

// x rounded once to dt (BF16 or F16), as fp32.
std::vector<float> RoundedTo(DType dt, const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = RoundedOnce(dt, x[i]);
  return r;
}

TEST_P(KdaChunkTest, HalfPrecisionIntermediateStatesAreTheFp32StatesRoundedOnceInEverySplitAndLayout) {
  // h in bf16 and fp16 is the fp32 run's h on the same input values rounded
  // once, bit for bit, however the optimized prefill splits the work and
  // stores the states: one sequence's columns split across tasks (V = 128 at
  // H = 1), heads in lockstep groups, V tails (V = 40), K-major and V-first
  // states, initial states or zeros, both chunk sizes, one and three threads;
  // and in the pool form (chunk 0 from the slot, fresh and padding sequences).
  const std::vector<Spec> specs = {
      {.lengths = {130}, .H = 1, .K = 32, .gate = kStress, .seed = 1341, .V = 128},
      {.lengths = {64, 0, 33, 97},
       .H = 2,
       .K = 24,
       .gate = kStress,
       .l2norm_in_kernel = true,
       .initial_state = false,
       .seed = 1342,
       .HV = 4,
       .V = 40},
  };
  for (Spec s : specs) {
    for (bool v_first : {false, true}) {
      s.state_v_first = v_first;
      for (DType dt : {DType::kBF16, DType::kF16}) {
        Problem p = MakeProblem(s);
        RoundInputsTo(p, dt);
        for (int threads : {1, 3}) {
          const ThreadScope scope(threads);
          for (int cs : {32, 64}) {
            SCOPED_TRACE(Describe(s) + " " + DTypeName(dt) + " threads " + std::to_string(threads) + " chunk_size " +
                         std::to_string(cs));
            const IntermediateRun half = RunIntermediate(variant(), p, cs, dt);
            const std::vector<float> want = RoundedTo(dt, RunIntermediate(variant(), p, cs).h);
            ASSERT_EQ(half.h.size(), want.size());
            ASSERT_GT(want.size(), 0U);
            EXPECT_TRUE(BitEqual(half.h.data(), want.data(), want.size()));
          }
        }
      }
    }
  }
  const std::vector<int32_t> idx = {2, -1, 0, 3};
  const std::vector<uint8_t> has_init = {1, 1, 1, 0};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string("pool form ") + DTypeName(dt));
    Problem p = MakeProblem({.lengths = {100, 40, 0, 65}, .H = 2, .K = 32, .seed = 1343});
    RoundInputsTo(p, dt);
    const size_t size = static_cast<size_t>(NumChunks(p, 32)) * p.HV * p.HeadState();
    Typed half(size, dt, kSentinel);
    Typed f32(size, DType::kF32, kSentinel);
    RunChunkPool(variant(), p, idx, has_init, 4, dt, nullptr, -1, &half, 32);
    RunChunkPool(variant(), p, idx, has_init, 4, DType::kF32, nullptr, -1, &f32, 32);
    const std::vector<float> want = RoundedTo(dt, f32.ToF32());
    EXPECT_TRUE(BitEqual(half.ToF32().data(), want.data(), want.size()));
  }
}

TEST_P(KdaChunkTest, IntermediateStatesOfEqualRowsWithoutCuSeqlens) {
  // B rows of T tokens: h [B, ceil(T / chunk_size), ...], the same as the
  // packed sequences with cu_seqlens.
  const Problem p = MakeProblem({.lengths = {70, 70, 70}, .H = 2, .K = 16, .gate = kStress, .seed = 1311, .V = 24});
  for (int cs : {32, 64}) {
    const IntermediateRun rows = RunIntermediate(variant(), p, cs, DType::kF32, 3);
    const IntermediateRun packed = RunIntermediate(variant(), p, cs);
    EXPECT_TRUE(BitEqual(rows.h.data(), packed.h.data(), packed.h.size()));
    ExpectBitEqual(rows.result, packed.result);
  }
}

TEST_P(KdaChunkTest, IntermediateStatesInPoolFormWithPaddingAndAliasing) {
  // The pool form: chunk 0 is the slot's state, read before the kernel writes
  // the final state into that slot; fresh sequences start from zeros; padding
  // sequences' chunks are zero. Against the contiguous form, bit for bit.
  const Problem p = MakeProblem({.lengths = {100, 40, 0, 65}, .H = 2, .K = 32, .seed = 1321});
  const std::vector<int32_t> idx = {2, -1, 0, 3};
  const std::vector<uint8_t> has_init = {1, 1, 1, 0};
  const IntermediateRun want = RunIntermediate(variant(), ZeroFreshStates(p, has_init), 64);
  const size_t per = static_cast<size_t>(p.HV) * p.HeadState();
  std::vector<float> pool(4 * per, kSentinel);
  for (int64_t n = 0; n < p.N; ++n) {
    if (idx[n] >= 0) std::copy_n(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, pool.begin() + idx[n] * per);
  }
  const TypedInputs in(p, DType::kF32, DType::kF32);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF32, kSentinel);
  const int64_t nt = NumChunks(p, 64);
  std::vector<float> h(static_cast<size_t>(nt) * per, kSentinel);
  ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
  c.state = testing::MutStatesView(p, pool.data(), 4);
  c.state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {p.N});
  c.has_initial_state = ContiguousView<const void*>(has_init.data(), DType::kU8, {p.N});
  c.return_intermediate_states = true;
  c.intermediate_states = ContiguousView<void*>(h.data(), DType::kF32, {1, nt, p.HV, p.K, p.V});
  RunChunkCall(variant(), c);
  // Sequence 1 (padding) holds chunk 2 of the 5.
  ASSERT_EQ(nt, 5);
  for (size_t i = 0; i < h.size(); ++i) {
    const bool padding = i >= 2 * per && i < 3 * per;
    ASSERT_EQ(h[i], padding ? 0.0F : want.h[i]) << i;
  }
  EXPECT_TRUE(BitEqual(pool.data() + 2 * per, want.result.state.data(), per));
  EXPECT_TRUE(BitEqual(pool.data() + 3 * per, want.result.state.data() + 3 * per, per));
}

TEST_P(KdaChunkTest, IntermediateStatesAreValidated) {
  // A wrong shape, dtype or chunk size, h without the flag or the flag
  // without h: an error naming the argument, nothing written.
  const Problem p = MakeProblem({.lengths = {40, 30}, .H = 1, .K = 16, .seed = 1331});
  const TypedInputs in(p, DType::kF32, DType::kF32);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF32, kSentinel);
  std::vector<float> h(static_cast<size_t>(4) * p.HV * p.HeadState(), kSentinel);
  const auto call = [&](int64_t nt, DType dt, int cs, bool flag, bool with_h) {
    ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
    c.chunk_size = cs;
    c.return_intermediate_states = flag;
    if (with_h) c.intermediate_states = ContiguousView<void*>(h.data(), dt, {1, nt, p.HV, p.K, p.V});
    return c;
  };
  const auto expect_error = [&](const ChunkKdaCall& c, const std::string& what) {
    try {
      RunChunkCall(variant(), c);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // NT is 2 + 1 with chunk_size 32, 1 + 1 with 64.
  expect_error(call(2, DType::kF32, 32, true, true), "intermediate_states: expected shape");
  expect_error(call(3, DType::kF32, 64, true, true), "intermediate_states: expected shape");
  expect_error(call(2, DType::kBF16, 64, true, true), "intermediate_states: dtype must be k's");
  EXPECT_THROW(RunChunkCall(variant(), call(2, DType::kBF16, 64, true, true)), DTypeError);
  expect_error(call(2, DType::kF32, 64, false, true), "intermediate_states given without return_intermediate_states");
  expect_error(call(2, DType::kF32, 64, true, false), "intermediate_states: required with return_intermediate_states");
  expect_error(call(2, DType::kF32, 48, true, true), "`chunk_size` must be either 32 or 64");
  for (float x : o.ToF32()) ASSERT_EQ(x, kSentinel);
  for (float x : h) ASSERT_EQ(x, kSentinel);
  EXPECT_NO_THROW(RunChunkCall(variant(), call(2, DType::kF32, 64, true, true)));
  EXPECT_NO_THROW(RunChunkCall(variant(), call(3, DType::kF32, 32, true, true)));
  EXPECT_EQ(CheckChunkKdaShapes(call(3, DType::kF32, 32, true, true)).num_chunks, 3);
}

TEST_P(KdaChunkTest, SafeGateNeedsALowerBoundInTheSafeRange) {
  // fla's safe_gate with use_gate_in_kernel: lower_bound given and in [-5, 0),
  // else an error naming lower_bound (and safe_gate), from the bind and from
  // the shape check alike, nothing written. In range: fla's sigmoid gate,
  // against the float64 recurrence.
  Problem p =
      MakeProblem({.lengths = {3, 40}, .H = 1, .K = 16, .gate_in_kernel = true, .seed = 1401, .HV = 2, .V = 24});
  const TypedInputs in(p, DType::kF32, DType::kF32);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF32, kSentinel);
  std::vector<float> state(p.StateSize(), kSentinel);
  const auto call = [&](std::optional<float> lower_bound, bool gate_in_kernel = true) {
    ChunkKdaCall c = ChunkCallFor(p, in, o.Mut());
    SetStates(p, c, p.h0.data(), state.data());
    c.safe_gate = true;
    c.use_gate_in_kernel = gate_in_kernel;
    c.lower_bound = lower_bound;
    return c;
  };
  const struct {
    std::optional<float> lower_bound;
    const char* error;
  } refused[] = {
      {std::nullopt, "chunk_kda: lower_bound must be specified when safe_gate=True and use_gate_in_kernel=True"},
      {-6.0F, "chunk_kda: lower_bound must be in the safe range [-5, 0), got -6"},
      {-5.001F, "chunk_kda: lower_bound must be in the safe range [-5, 0), got -5.00"},
      {0.0F, "chunk_kda: lower_bound must be in the safe range [-5, 0), got 0"},
      {-0.0F, "chunk_kda: lower_bound must be in the safe range [-5, 0), got -0"},
      {0.5F, "chunk_kda: lower_bound: must be a finite number <= 0 (a log decay bound), got 0.5"},
  };
  for (const auto& r : refused) {
    SCOPED_TRACE(r.error);
    testing::ExpectErrorContaining([&] { RunChunkCall(variant(), call(r.lower_bound)); }, r.error);
    testing::ExpectErrorContaining([&] { CheckChunkKdaShapes(call(r.lower_bound)); }, r.error);
  }
  for (float x : o.ToF32()) ASSERT_EQ(x, kSentinel);
  for (float x : state) ASSERT_EQ(x, kSentinel);
  // Without use_gate_in_kernel safe_gate asks nothing (fla's check is on the in-kernel gate).
  EXPECT_NO_THROW(CheckChunkKdaShapes(call(std::nullopt, false)));
  for (float lower_bound : {-5.0F, -0.001F}) {
    SCOPED_TRACE("lower_bound " + std::to_string(lower_bound));
    RunChunkCall(variant(), call(lower_bound));
    p.lower_bound = lower_bound;
    ExpectClose({o.ToF32(), state}, NaiveRecurrenceF64(p));
  }
}

INSTANTIATE_TEST_SUITE_P(Kda, KdaChunkTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

// ------------------------------------------------- recurrent kernels (decode)

class KdaRecurrentTest : public VariantTest {};

// A pool of `slots` random states for p (normal, sd 0.5, from `seed`).
std::vector<float> RandomPool(const Problem& p, int64_t slots, uint32_t seed) {
  std::vector<float> pool(static_cast<size_t>(slots) * p.HV * p.HeadState());
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0F, 0.5F);
  for (float& x : pool) x = normal(rng);
  return pool;
}

// What a pool-form fused_recurrent_kda call on p (fp32, packed) left: its
// outputs [T, HV, V], the pool, and the states after every token
// [T, HV, ...] (kSentinel where none was written).
struct PoolRun {
  std::vector<float> out, pool, token_states;
};

// Runs p's tokens through `variant` from the pool `pool0` ([slots, HV, ...])
// with `idx` ([N], or [N, cols] with cols > 0) and, if given, `accepted`
// ([N]): the final states in place with `inplace`, else the state after every
// token into token_states.
PoolRun RunRecurrentPool(const Variant& variant, const Problem& p, const std::vector<float>& pool0, int64_t slots,
                         const std::vector<int32_t>& idx, int64_t cols, const std::vector<int32_t>* accepted,
                         bool inplace) {
  const TypedInputs in(p, DType::kF32, DType::kF32);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF32, kSentinel);
  RecurrentKdaCall c = testing::TokenCall<RecurrentKdaCall>(p, in, o.Mut(), 1, p.T);
  c.cu_seqlens = ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1});
  PoolRun r{.out = {},
            .pool = pool0,
            .token_states = std::vector<float>(static_cast<size_t>(p.T) * p.HV * p.HeadState(), kSentinel)};
  c.initial_state = testing::MutStatesView(p, r.pool.data(), slots);
  c.ssm_state_indices = cols > 0 ? ContiguousView<const void*>(idx.data(), DType::kI32, {p.N, cols})
                                 : ContiguousView<const void*>(idx.data(), DType::kI32, {p.N});
  if (accepted != nullptr) c.num_accepted_tokens = ContiguousView<const void*>(accepted->data(), DType::kI32, {p.N});
  c.inplace_final_state = inplace;
  if (!inplace) {
    c.output_final_state = true;
    c.final_state = testing::MutStatesView(p, r.token_states.data(), p.T);
  }
  RecurrentFn(variant)(BindRecurrentKda(c));
  r.out = o.ToF32();
  return r;
}

TEST_P(KdaRecurrentTest, PaddingWritesZerosAndTouchesNoState) {
  // Mixed padding / live entries in one call, on the parallel path.
  Problem shape;  // the head shape and (default) options of the call
  shape.H = 2;
  shape.K = 32;
  shape.HV = shape.H;
  shape.V = shape.K;
  const int h = shape.H, kd = shape.K;
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
  const TypedInputs in(q, k, v, g, beta, DType::kF32, DType::kF32);
  auto run = [&](const Variant& variant, std::vector<float>& states) {
    Typed o(4 * hk, DType::kF32, kSentinel);
    RecurrentFn(variant)(BindRecurrentKda(DecodeCallFor(shape, in, o.Mut(), states.data(), 4, idx)));
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
    p.HV = h;
    p.V = kd;
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

// Sequence n of p alone, its first `len` tokens, starting from `initial` ([HV, K, V] or empty: zeros).
Problem Prefix(const Problem& p, int64_t n, int64_t len, const std::vector<float>& initial) {
  Problem r = p;
  r.N = 1;
  r.T = len;
  r.cu = {0, len};
  const auto first = static_cast<size_t>(p.cu[n]);
  auto rows = [&](const std::vector<float>& x, size_t row) {
    return std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(first * row),
                              x.begin() + static_cast<std::ptrdiff_t>((first + len) * row));
  };
  r.q = rows(p.q, p.KeyRow());
  r.k = rows(p.k, p.KeyRow());
  r.v = rows(p.v, p.ValueRow());
  r.g = rows(p.g, p.GateRow());
  r.beta = rows(p.beta, p.BetaRow());
  r.h0 = initial;
  return r;
}

// Several tokens per sequence, packed with cu_seqlens or as B rows, with
// contiguous states: fla's fused_recurrent_kda (a final state per sequence,
// into a new buffer or back into initial_state; K-major or V-first; from
// given states or zeros). Sequences of two or more tokens take the optimized
// kernel's chunk form, 8 tokens at a time (17 tokens: chunks of 8, 8 and 1),
// the others its token-by-token steps; packed, also Mamba2's recurrence with its skip D (no delta correction, a
// scalar gate).
TEST_P(KdaRecurrentTest, SeveralTokensPerSequence) {
  for (int form = 0; form < 3; ++form) {  // 0, 1: packed, B rows; 2: packed, Mamba2's
    const bool packed = form != 1;
    for (bool v_first : {false, true}) {
      for (int states = 0; states < 3; ++states) {  // 0: a new final_state, 1: in place, 2: from zeros
        const bool inplace = states == 1;
        Spec s{.lengths = packed ? std::vector<int64_t>{3, 0, 17, 1} : std::vector<int64_t>{5, 5, 5},
               .H = 2,
               .K = 24,
               .gate = kStress,
               .l2norm_in_kernel = v_first,
               .gate_in_kernel = true,
               .initial_state = states != 2,
               .seed = 631,
               .HV = 4,
               .V = 40,
               .beta_per_value = !packed,
               .state_v_first = v_first};
        if (form == 2) {
          s.scale = 1.0F;
          s.scalar_gate = true;
          s.delta_correction = false;
          s.skip = true;
        }
        SCOPED_TRACE(Describe(s) + (inplace ? " inplace" : " new final_state"));
        const Problem p = MakeProblem(s);
        const TypedInputs in(p, DType::kF32, DType::kF32);
        Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF32, kSentinel);
        const int64_t rows = packed ? 1 : p.N;
        const int64_t t = packed ? p.T : p.T / p.N;
        RecurrentKdaCall c = testing::TokenCall<RecurrentKdaCall>(p, in, o.Mut(), rows, t);
        if (packed) c.cu_seqlens = ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1});
        c.state_v_first = v_first;
        std::vector<float> initial = p.h0;
        std::vector<float> final_state(p.StateSize(), kSentinel);
        if (!initial.empty()) c.initial_state = testing::MutStatesView(p, initial.data(), p.N);
        c.inplace_final_state = inplace;
        if (!inplace) {
          c.output_final_state = true;
          c.final_state = testing::MutStatesView(p, final_state.data(), p.N);
        }
        RecurrentFn(variant())(BindRecurrentKda(c));
        const Result want = NaiveRecurrenceF64(p);
        ExpectClose({o.ToF32(), inplace ? initial : final_state}, want);
        if (!inplace && !p.h0.empty()) {
          EXPECT_TRUE(BitEqual(initial.data(), p.h0.data(), p.h0.size())) << "initial_state written";
        }
      }
    }
  }
}

// fla's pool and speculative semantics: 2-D ssm_state_indices [N, C], the
// initial state from slot [n, num_accepted_tokens[n] - 1], the state after
// token t into slot [n, t] (negative: not written), or with
// inplace_final_state=False into row bos + t of the returned buffer; a
// padding sequence (negative read slot) writes zeros and touches no state.
TEST_P(KdaRecurrentTest, SlotsPerTokenForSpeculativeDecoding) {
  // A gate per key dimension (KDA), and one per value head (GDN, three value heads per key head).
  for (bool scalar_gate : {false, true}) {
    const Spec s{.lengths = {4, 2, 3, 2},
                 .H = 1,
                 .K = 20,
                 .gate = scalar_gate ? GateKind::kLoud : kStress,
                 .initial_state = false,
                 .seed = 641,
                 .HV = scalar_gate ? 3 : 2,
                 .V = 28,
                 .state_v_first = true,
                 .scalar_gate = scalar_gate};
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    constexpr int64_t kCols = 4;
    constexpr int64_t kSlots = 12;
    const std::vector<int32_t> idx = {1, 2, 3, 4, /* */ 5, 6, -1, -1, /* */ 7, 8, 9, 10, /* */ -1, 11, -1, -1};
    const std::vector<int32_t> accepted = {2, 1, 3, 1};  // sequence 3 reads idx[3][0] = -1: padding
    const size_t per_slot = static_cast<size_t>(p.HV) * p.HeadState();
    const std::vector<float> pool0 = RandomPool(p, kSlots, 7);
    auto slot = [&](const std::vector<float>& pool, int64_t i) {
      return std::vector<float>(pool.begin() + static_cast<std::ptrdiff_t>(i * per_slot),
                                pool.begin() + static_cast<std::ptrdiff_t>((i + 1) * per_slot));
    };
    for (bool inplace : {true, false}) {
      SCOPED_TRACE(inplace ? "inplace_final_state" : "a state per token");
      const auto [out, pool, token_states] =
          RunRecurrentPool(variant(), p, pool0, kSlots, idx, kCols, &accepted, inplace);
      std::vector<bool> written(kSlots, false);
      for (int64_t n = 0; n < p.N; ++n) {
        const int32_t read = idx[n * kCols + accepted[n] - 1];
        const int64_t len = p.cu[n + 1] - p.cu[n];
        for (int64_t t = 0; t < len; ++t) {
          const size_t row = static_cast<size_t>(p.cu[n] + t) * p.ValueRow();
          if (read < 0) {
            for (size_t j = 0; j < p.ValueRow(); ++j) EXPECT_EQ(out[row + j], 0.0F) << "padding output";
            continue;
          }
          const Result want = NaiveRecurrenceF64(Prefix(p, n, t + 1, slot(pool0, read)));
          const size_t last = static_cast<size_t>(t) * p.ValueRow();
          EXPECT_TRUE(AllCloseF32(out.data() + row, want.o.data() + last, p.ValueRow())) << n << "," << t;
          const float* got = nullptr;
          if (inplace) {
            const int32_t dst = idx[n * kCols + t];
            if (dst < 0) continue;
            written[dst] = true;
            got = pool.data() + static_cast<size_t>(dst) * per_slot;
          } else {
            got = token_states.data() + static_cast<size_t>(p.cu[n] + t) * per_slot;
          }
          EXPECT_TRUE(AllCloseF32(got, want.state.data(), per_slot)) << "state after token " << t << " of " << n;
        }
      }
      for (int64_t i = 0; i < kSlots; ++i) {
        if (!written[i]) {
          EXPECT_TRUE(BitEqual(pool.data() + i * per_slot, pool0.data() + i * per_slot, per_slot)) << i;
        }
      }
      if (!inplace) {
        const size_t pad_rows = static_cast<size_t>(p.cu[3]) * per_slot;  // sequence 3's rows stay unwritten
        for (size_t i = pad_rows; i < token_states.size(); ++i) ASSERT_EQ(token_states[i], kSentinel) << i;
      }
    }
  }
}

// Several tokens per sequence with q, k, v slices of a fused projection: the
// same bits as contiguous ones, packed (2-D slots per token, a padding
// sequence) and as B rows of T tokens (1-D slots), bf16.
TEST_P(KdaRecurrentTest, TokenStridedQkvWithSeveralTokensPerSequence) {
  for (bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packed" : "B rows");
    const Spec s{.lengths = packed ? std::vector<int64_t>{4, 2, 3, 2} : std::vector<int64_t>{3, 3, 3},
                 .H = 1,
                 .K = 20,
                 .gate = kStress,
                 .seed = 661,
                 .HV = 2,
                 .V = 28};
    Problem p = MakeProblem(s);
    RoundInputsTo(p, DType::kBF16);
    constexpr int64_t kSlots = 12;
    const std::vector<int32_t> idx = packed
                                         ? std::vector<int32_t>{1, 2, 3, 4, 5, 6, -1, -1, 7, 8, 9, 10, -1, 11, -1, -1}
                                         : std::vector<int32_t>{4, 9, 2};
    const std::vector<int32_t> accepted = {2, 1, 3, 1};
    const std::vector<float> pool0 = RandomPool(p, kSlots, 8);
    auto run = [&](int64_t pad) {
      const TypedInputs in(p, DType::kBF16, DType::kF32);
      Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kBF16, kSentinel);
      const int64_t rows = packed ? 1 : p.N;
      RecurrentKdaCall c = testing::TokenCall<RecurrentKdaCall>(p, in, o.Mut(), rows, p.T / rows);
      Result r{{}, pool0};
      c.initial_state = testing::MutStatesView(p, r.state.data(), kSlots);
      if (packed) {
        c.cu_seqlens = ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1});
        c.ssm_state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {p.N, 4});
        c.num_accepted_tokens = ContiguousView<const void*>(accepted.data(), DType::kI32, {p.N});
      } else {
        c.ssm_state_indices = ContiguousView<const void*>(idx.data(), DType::kI32, {p.N});
      }
      std::optional<testing::FusedQkv> fused;
      if (pad >= 0) fused.emplace(c, pad);
      RecurrentFn(variant())(BindRecurrentKda(c));
      r.o = o.ToF32();
      return r;
    };
    const Result want = run(-1);
    EXPECT_FALSE(BitEqual(want.state.data(), pool0.data(), pool0.size()));
    for (int64_t pad : {0, 5}) ExpectBitEqual(run(pad), want);
  }
}

// 1-D ssm_state_indices [N] with several tokens per sequence, a documented
// deviation from fla (which reads and writes slot [n + t], docs/fla-api.md):
// sequence n reads slot idx[n] and writes its state after its last token
// there and nowhere else (not slot idx[n] + t, not sequence n + t's slot),
// against the float64 recurrence; a padding sequence (negative index) has
// zero outputs; an empty one leaves its slot as it was. With
// inplace_final_state=False the state after every token goes to row bos + t
// of final_state and the pool is only read. Sequences of 9 and 17 tokens take
// the optimized kernel's chunk form (8 tokens at a time).
TEST_P(KdaRecurrentTest, OneDimensionalIndicesWriteTheFinalStateToSlotN) {
  const Problem p = MakeProblem({.lengths = {3, 0, 9, 2, 4, 17},
                                 .H = 2,
                                 .K = 20,
                                 .gate = kStress,
                                 .initial_state = false,
                                 .seed = 691,
                                 .HV = 4,
                                 .V = 12,
                                 .state_v_first = true});
  const std::vector<int32_t> idx = {5, 0, 2, 8, -1, 10};
  constexpr int64_t kSlots = 12;
  const size_t per_slot = static_cast<size_t>(p.HV) * p.HeadState();
  const std::vector<float> pool0 = RandomPool(p, kSlots, 9);
  // The float64 recurrence from each sequence's slot (padding: zeros, unchecked).
  Problem from_slots = p;
  from_slots.h0.assign(p.StateSize(), 0.0F);
  for (int64_t n = 0; n < p.N; ++n) {
    if (idx[n] >= 0) {
      std::copy_n(pool0.begin() + static_cast<std::ptrdiff_t>(idx[n] * per_slot), per_slot,
                  from_slots.h0.begin() + static_cast<std::ptrdiff_t>(n * per_slot));
    }
  }
  std::vector<float> token_states_want;
  const Result want = NaiveRecurrenceF64(from_slots, 64, nullptr, &token_states_want);
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "inplace_final_state" : "a state per token");
    const auto [out, pool, token_states] = RunRecurrentPool(variant(), p, pool0, kSlots, idx, 0, nullptr, inplace);
    std::vector<bool> written(kSlots, false);
    for (int64_t n = 0; n < p.N; ++n) {
      SCOPED_TRACE("sequence " + std::to_string(n) + " slot " + std::to_string(idx[n]));
      const size_t rows = static_cast<size_t>(p.cu[n + 1] - p.cu[n]);
      const size_t first = static_cast<size_t>(p.cu[n]);
      if (idx[n] < 0) {
        for (size_t i = 0; i < rows * p.ValueRow(); ++i) ASSERT_EQ(out[first * p.ValueRow() + i], 0.0F);
        for (size_t i = 0; i < rows * per_slot; ++i) ASSERT_EQ(token_states[first * per_slot + i], kSentinel);
        continue;
      }
      EXPECT_TRUE(
          AllCloseF32(out.data() + first * p.ValueRow(), want.o.data() + first * p.ValueRow(), rows * p.ValueRow()))
          << "outputs";
      if (inplace && rows > 0) {
        written[idx[n]] = true;
        EXPECT_TRUE(AllCloseF32(pool.data() + idx[n] * per_slot, want.state.data() + n * per_slot, per_slot))
            << "final state in slot idx[n]";
      }
      if (!inplace) {
        EXPECT_TRUE(AllCloseF32(token_states.data() + first * per_slot, token_states_want.data() + first * per_slot,
                                rows * per_slot))
            << "state after every token";
      }
    }
    for (int64_t slot = 0; slot < kSlots; ++slot) {
      if (!written[slot]) {
        EXPECT_TRUE(BitEqual(pool.data() + slot * per_slot, pool0.data() + slot * per_slot, per_slot))
            << "slot " << slot << " written";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kda, KdaRecurrentTest, ::testing::ValuesIn(AllVariants()), VariantParamName());

}  // namespace
}  // namespace kda
