// Tests of the optimized KDA kernels: equivalence with the reference kernels
// within the fp32 tolerance (design §5) on random problems, stress gates
// included, for every instruction-set variant the CPU supports (forced through
// SetKernelIsa); state semantics (aliasing, empty sequences, padding, slot 0,
// exact causality, thread-count independence); the ISA override.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
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
using testing::ExpectBitEqual;
using testing::ExpectClose;
using testing::ExpectErrorContaining;
using testing::GateKind;
using testing::kSentinel;
using testing::MakeProblem;
using testing::Problem;
using testing::Result;
using testing::RoundInputsToBF16;
using testing::Spec;
using testing::Typed;

enum class Impl { kReference, kOptimized };

// chunk_kda over the whole packed batch.
Result RunChunk(const Problem& p, Impl impl, const ChunkRun& run = {}) {
  return testing::RunChunkWith(p, impl == Impl::kReference ? &chunk_kda_reference : &chunk_kda_optimized, run);
}

// fused_recurrent_kda token by token: step t runs every sequence that has a
// token t, the others are padding (index -1). Sequence n lives in slot n + 1
// of the state buffer; slot 0 must never be touched.
Result RunDecode(const Problem& p, Impl impl, DType qkv = DType::kF32, DType gb = DType::kF32) {
  return testing::RunTokenByToken(
      p, impl == Impl::kReference ? &fused_recurrent_kda_reference : &fused_recurrent_kda_optimized, qkv, gb);
}

// The ISA variants this CPU supports.
std::vector<KernelIsa> SupportedIsas() {
  std::vector<KernelIsa> r;
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuSupportsKernelIsa(isa)) r.push_back(isa);
  }
  return r;
}

// Restores KDA_ISA, the forced ISA and the thread count when a test ends.
class KdaOptimizedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("KDA_ISA");
    if (env != nullptr) saved_env_ = env;
    saved_threads_ = NumThreads();
  }
  void TearDown() override {
    if (saved_env_) {
      setenv("KDA_ISA", saved_env_->c_str(), 1);
    } else {
      unsetenv("KDA_ISA");
    }
    internal::ResetKernelIsaForTesting();
    SetNumThreads(saved_threads_);
  }

  // Runs check() once per supported ISA variant, forced through SetKernelIsa.
  static void ForEachIsa(const std::function<void()>& check) {
    for (KernelIsa isa : SupportedIsas()) {
      SCOPED_TRACE(std::string("isa=") + KernelIsaName(isa));
      SetKernelIsa(isa);
      check();
    }
  }

  // Optimized chunk vs reference chunk and optimized decode vs reference decode.
  static void CheckAgainstReference(const Spec& s, bool decode = true) {
    SCOPED_TRACE(Describe(s));
    const Problem p = MakeProblem(s);
    const Result chunk_ref = RunChunk(p, Impl::kReference);
    std::optional<Result> decode_ref;
    if (decode) decode_ref = RunDecode(p, Impl::kReference);
    ForEachIsa([&] {
      ExpectClose(RunChunk(p, Impl::kOptimized), chunk_ref);
      if (decode) ExpectClose(RunDecode(p, Impl::kOptimized), *decode_ref);
    });
  }

 private:
  std::optional<std::string> saved_env_;
  int saved_threads_ = 1;
};

const std::vector<int64_t> kRagged = {0, 1, 31, 32, 33, 65, 130};

// ------------------------------------------------- equivalence

TEST_F(KdaOptimizedTest, MatchesReferenceOnRaggedBatches) {
  uint32_t seed = 200;
  for (int k : {64, 128}) {
    for (bool init : {false, true}) {
      Spec s;
      s.lengths = kRagged;
      s.H = k == 64 ? 3 : 2;
      s.K = k;
      s.initial_state = init;
      s.seed = ++seed;
      CheckAgainstReference(s, /*decode=*/k == 64);
    }
  }
}

TEST_F(KdaOptimizedTest, MatchesReferenceWithStressGates) {
  Spec s;
  s.lengths = {1, 70, 260};
  s.H = 2;
  s.K = 128;
  s.gate = GateKind::kStress;
  s.seed = 211;
  CheckAgainstReference(s);

  s.lengths = kRagged;
  s.K = 64;
  s.initial_state = false;
  s.scale = 0.3F;  // an explicit scale
  s.seed = 212;
  CheckAgainstReference(s);
}

TEST_F(KdaOptimizedTest, MatchesReferenceOnLongSequences) {
  // Hundreds of tokens: the scaled state rows are materialised many times
  // (mild gates reach the 2^-64 threshold after ~1000 steps in the slow
  // dimensions, stress gates at every -250 step).
  for (GateKind gate : {GateKind::kMild, GateKind::kStress}) {
    Spec s;
    s.lengths = {1100};
    s.H = 1;
    s.K = 128;
    s.gate = gate;
    s.seed = gate == GateKind::kMild ? 221 : 222;
    CheckAgainstReference(s, /*decode=*/false);
  }
}

TEST_F(KdaOptimizedTest, MatchesReferenceWithHeadGroups) {
  // Enough (sequence, head) pairs for heads to run in lockstep groups
  // (including a partial last group: H = 10), ragged sequences, two token blocks.
  Spec s;
  s.lengths = {40, 1, 0, 75};
  s.H = 10;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 225;
  CheckAgainstReference(s);
}

TEST_F(KdaOptimizedTest, MatchesReferenceWithoutDecay) {
  // g = 0: the row scales stay exactly 1.
  Spec s;
  s.lengths = {40, 3};
  s.H = 2;
  s.K = 32;
  s.gate = GateKind::kNone;
  s.seed = 231;
  CheckAgainstReference(s);
}

TEST_F(KdaOptimizedTest, MatchesReferenceOnSmallAndOddHeadDims) {
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
    CheckAgainstReference(s);
  }
}

TEST_F(KdaOptimizedTest, MatchesReferenceWithInKernelNormAndGate) {
  for (GateKind gate : {GateKind::kMild, GateKind::kStress}) {
    Spec s;
    s.lengths = kRagged;
    s.H = 2;
    s.K = 64;
    s.gate = gate;
    s.gate_in_kernel = true;
    s.l2norm_in_kernel = true;
    s.seed = gate == GateKind::kMild ? 251 : 252;
    CheckAgainstReference(s);
  }
  Spec s;  // the norm alone at K = 128
  s.lengths = {50, 77};
  s.H = 2;
  s.K = 128;
  s.l2norm_in_kernel = true;
  s.seed = 253;
  CheckAgainstReference(s);
}

TEST_F(KdaOptimizedTest, MatchesReferenceWithBf16Inputs) {
  Spec s;
  s.lengths = {0, 1, 33, 100};
  s.H = 2;
  s.K = 128;
  s.gate = GateKind::kStress;
  s.l2norm_in_kernel = true;
  s.seed = 261;
  Problem p = MakeProblem(s);
  RoundInputsToBF16(p);
  const ChunkRun bf16{DType::kBF16, DType::kBF16};
  const ChunkRun mixed{DType::kF32, DType::kBF16};
  const Result ref_bf16 = RunChunk(p, Impl::kReference, bf16);
  const Result ref_f32 = RunChunk(p, Impl::kReference);
  const Result ref_mixed = RunChunk(p, Impl::kReference, mixed);
  const Result dec_bf16 = RunDecode(p, Impl::kReference, DType::kBF16, DType::kBF16);
  const Result dec_f32 = RunDecode(p, Impl::kReference);
  ForEachIsa([&] {
    // bf16 storage of the same values runs the same fp32 arithmetic: the state
    // is identical to the fp32 run's, the output is the fp32 output rounded once.
    const Result opt_bf16 = RunChunk(p, Impl::kOptimized, bf16);
    const Result opt_f32 = RunChunk(p, Impl::kOptimized);
    EXPECT_TRUE(BitEqual(opt_bf16.state.data(), opt_f32.state.data(), opt_f32.state.size()));
    for (size_t i = 0; i < opt_f32.o.size(); ++i) ASSERT_EQ(opt_bf16.o[i], RoundBF16(opt_f32.o[i])) << i;
    // x: the reference kernel's fp32 run on the same (bf16-exact) inputs.
    EXPECT_TRUE(AllCloseBF16(opt_bf16.o.data(), ref_bf16.o.data(), ref_f32.o.data(), ref_bf16.o.size()));
    EXPECT_TRUE(AllCloseF32(opt_bf16.state.data(), ref_bf16.state.data(), ref_bf16.state.size()));
    ExpectClose(opt_f32, ref_f32);
    ExpectClose(RunChunk(p, Impl::kOptimized, mixed), ref_mixed);
    const Result opt_dec = RunDecode(p, Impl::kOptimized, DType::kBF16, DType::kBF16);
    EXPECT_TRUE(AllCloseBF16(opt_dec.o.data(), dec_bf16.o.data(), dec_f32.o.data(), dec_bf16.o.size()));
    EXPECT_TRUE(AllCloseF32(opt_dec.state.data(), dec_bf16.state.data(), dec_bf16.state.size()));
  });
}

TEST_F(KdaOptimizedTest, PrefillThenDecodeMatchesReferencePrefill) {
  // Prefill the first tokens with the optimized chunk kernel, decode the rest
  // with the optimized recurrent kernel: equal to one reference prefill.
  Spec s;
  s.lengths = {90};
  s.H = 2;
  s.K = 128;
  s.gate = GateKind::kStress;
  s.seed = 271;
  const Problem p = MakeProblem(s);
  const Result full = RunChunk(p, Impl::kReference);
  const size_t hk = static_cast<size_t>(p.H) * p.K;
  const int64_t split = 80;
  Problem head = p;
  Problem tail = p;
  auto cut = [](std::vector<float>& x, size_t begin, size_t end) {
    x = std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(begin),
                           x.begin() + static_cast<std::ptrdiff_t>(end));
  };
  for (auto [hp, tp] : {std::pair{&head.q, &tail.q}, {&head.k, &tail.k}, {&head.v, &tail.v}, {&head.g, &tail.g}}) {
    cut(*hp, 0, split * hk);
    cut(*tp, split * hk, 90 * hk);
  }
  cut(head.beta, 0, split * p.H);
  cut(tail.beta, split * p.H, 90 * p.H);
  head.T = split;
  head.cu = {0, split};
  tail.T = 90 - split;
  tail.cu = {0, 90 - split};
  ForEachIsa([&] {
    const Result first = RunChunk(head, Impl::kOptimized);
    tail.h0 = first.state;
    const Result second = RunDecode(tail, Impl::kOptimized);
    EXPECT_TRUE(AllCloseF32(first.o.data(), full.o.data(), first.o.size()));
    EXPECT_TRUE(AllCloseF32(second.o.data(), full.o.data() + first.o.size(), second.o.size()));
    EXPECT_TRUE(AllCloseF32(second.state.data(), full.state.data(), full.state.size()));
  });
}

// ------------------------------------------------- state semantics

TEST_F(KdaOptimizedTest, AliasedStatesMatchSeparate) {
  Spec s;
  s.lengths = {0, 65, 1, 0, 130};
  s.H = 2;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 281;
  const Problem p = MakeProblem(s);
  ChunkRun alias;
  alias.alias = true;
  ForEachIsa([&] { ExpectBitEqual(RunChunk(p, Impl::kOptimized, alias), RunChunk(p, Impl::kOptimized)); });
}

TEST_F(KdaOptimizedTest, EmptySequencesKeepTheirStateExactly) {
  Spec s;
  s.lengths = {0, 5, 0};
  s.H = 2;
  s.K = 32;
  s.seed = 291;
  const Problem p = MakeProblem(s);
  Problem no_h0 = p;
  no_h0.h0.clear();
  const size_t per_seq = static_cast<size_t>(p.H) * p.K * p.K;
  ForEachIsa([&] {
    for (bool alias : {false, true}) {
      ChunkRun run;
      run.alias = alias;
      const Result r = RunChunk(p, Impl::kOptimized, run);
      for (int64_t n : {0, 2}) {
        EXPECT_TRUE(BitEqual(r.state.data() + n * per_seq, p.h0.data() + n * per_seq, per_seq))
            << "sequence " << n << (alias ? " (aliased)" : "");
      }
    }
    const Result r = RunChunk(no_h0, Impl::kOptimized);
    for (int64_t n : {0, 2}) {
      for (size_t i = 0; i < per_seq; ++i) ASSERT_EQ(r.state[n * per_seq + i], 0.0F);
    }
  });
}

TEST_F(KdaOptimizedTest, EmptyBatchAndNoFinalState) {
  // T = 0: no token buffers; the final state is the initial state.
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
  chunk_kda_optimized(a);
  EXPECT_EQ(final_state, h0);

  // Without output_final_state the final buffer is untouched; outputs as usual.
  Spec s;
  s.lengths = {3, 70};
  s.H = 1;
  s.K = 16;
  s.seed = 301;
  const Problem p = MakeProblem(s);
  ChunkRun run;
  run.output_final_state = false;
  const Result want = RunChunk(p, Impl::kReference);
  ForEachIsa([&] {
    const Result r = RunChunk(p, Impl::kOptimized, run);
    for (float x : r.state) ASSERT_EQ(x, kSentinel);
    EXPECT_TRUE(AllCloseF32(r.o.data(), want.o.data(), want.o.size()));
  });
}

TEST_F(KdaOptimizedTest, OutputsAreExactlyCausal) {
  // Token t's output must not depend on later tokens, not even at rounding level (design §8.3).
  Spec s;
  s.lengths = {150};
  s.H = 2;
  s.K = 32;
  s.gate = GateKind::kStress;
  s.seed = 311;
  const Problem p = MakeProblem(s);
  const size_t hk = static_cast<size_t>(p.H) * p.K;
  ForEachIsa([&] {
    const Result full = RunChunk(p, Impl::kOptimized);
    for (int64_t len : {1, 31, 33, 100}) {
      Problem part = p;
      for (std::vector<float>* x : {&part.q, &part.k, &part.v, &part.g}) x->resize(len * hk);
      part.beta.resize(len * p.H);
      part.T = len;
      part.cu = {0, len};
      const Result r = RunChunk(part, Impl::kOptimized);
      EXPECT_TRUE(BitEqual(r.o.data(), full.o.data(), r.o.size())) << "prefix of " << len;
    }
  });
}

TEST_F(KdaOptimizedTest, ResultsDoNotDependOnThreadCountOrTaskSplit) {
  // Few (sequence, head) pairs: with several threads a head's value columns
  // are split over tasks; many pairs: heads run in lockstep groups of up to
  // four. Every split must give the same bits.
  for (int h : {1, 3, 16}) {
    Spec s;
    s.lengths = h == 16 ? std::vector<int64_t>{70, 0, 33, 5} : std::vector<int64_t>{70};
    s.H = h;
    s.K = h == 16 ? 32 : 128;
    s.gate = GateKind::kStress;
    s.seed = 320 + h;
    const Problem p = MakeProblem(s);
    ForEachIsa([&] {
      SetNumThreads(1);
      const Result one = RunChunk(p, Impl::kOptimized);
      const Result one_dec = RunDecode(p, Impl::kOptimized);
      for (int threads : {2, 3, 8}) {
        SetNumThreads(threads);
        ExpectBitEqual(RunChunk(p, Impl::kOptimized), one);
        ExpectBitEqual(RunDecode(p, Impl::kOptimized), one_dec);
      }
    });
  }
}

TEST_F(KdaOptimizedTest, AlignedAndUnalignedOutputsGiveTheSameBits) {
  // Aligned output rows take the streaming stores, others the plain ones.
  Spec s;
  s.lengths = {0, 1, 37, 70};
  s.H = 3;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.seed = 330;
  const Problem p = MakeProblem(s);
  ForEachIsa([&] {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(DTypeName(dt));
      ChunkRun aligned;
      aligned.qkv = dt;
      const Result want = RunChunk(p, Impl::kOptimized, aligned);
      for (int shift : {1, 8}) {
        ChunkRun run = aligned;
        run.out_shift = shift;
        ExpectBitEqual(RunChunk(p, Impl::kOptimized, run), want);
      }
    }
  });
}

TEST_F(KdaOptimizedTest, DecodePaddingWritesZerosAndTouchesNoState) {
  // Mixed padding / live entries in one call, reference and optimized.
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
  auto run = [&](Impl impl, std::vector<float>& states) {
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
    if (impl == Impl::kReference) {
      fused_recurrent_kda_reference(a);
    } else {
      fused_recurrent_kda_optimized(a);
    }
    return o.ToF32();
  };
  // Entries 1 and 3 are padding: zero outputs, their slots (1, 3) untouched;
  // the live entries write outputs and update slots 2 and 0.
  auto check_padding = [&](const std::vector<float>& o, const std::vector<float>& states) {
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
  };
  std::vector<float> ref_states = states0;
  const std::vector<float> ref_o = run(Impl::kReference, ref_states);
  {
    SCOPED_TRACE("reference");
    check_padding(ref_o, ref_states);
  }
  ForEachIsa([&] {
    std::vector<float> states = states0;
    const std::vector<float> o = run(Impl::kOptimized, states);
    check_padding(o, states);
    EXPECT_TRUE(AllCloseF32(o.data(), ref_o.data(), o.size()));
    EXPECT_TRUE(AllCloseF32(states.data(), ref_states.data(), states.size()));
  });
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
PoolResult RunChunkPool(const Problem& p, Impl impl, const std::vector<int32_t>& idx,
                        const std::vector<uint8_t>& has_init, int64_t num_states, DType qkv = DType::kF32) {
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  PoolResult r;
  r.pool.assign(static_cast<size_t>(num_states) * per, kSentinel);
  for (int64_t n = 0; n < p.N; ++n) {
    if (idx[n] >= 0 && (has_init.empty() || has_init[n] != 0) && !p.h0.empty()) {
      std::copy_n(p.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, r.pool.begin() + idx[n] * per);
    }
  }
  const Typed q(p.q, qkv), k(p.k, qkv), v(p.v, qkv), g(p.g, DType::kF32), beta(p.beta, DType::kF32);
  Typed o(p.q.size(), qkv, kSentinel);
  ChunkKdaArgs a;
  a.o = o.Mut();
  a.q = q.Const();
  a.k = k.Const();
  a.v = v.Const();
  a.g = g.Const();
  a.beta = beta.Const();
  a.cu_seqlens = p.cu.data();
  a.state = r.pool.data();
  a.state_indices = idx.data();
  a.num_states = num_states;
  a.has_initial_state = has_init.empty() ? nullptr : has_init.data();
  a.T = p.T;
  a.N = p.N;
  a.H = p.H;
  a.K = a.V = p.K;
  a.options = p.Options();
  if (impl == Impl::kReference) {
    chunk_kda_reference(a);
  } else {
    chunk_kda_optimized(a);
  }
  r.o = o.ToF32();
  return r;
}

// The pool-form call against the contiguous form of the same kernel (initial
// states of fresh sequences zeroed), bit for bit: live sequences' outputs and
// final states (in their slots), padding outputs zero, every other slot
// untouched.
void ExpectPoolMatchesContiguous(const Problem& p, Impl impl, const std::vector<int32_t>& idx,
                                 const std::vector<uint8_t>& has_init, int64_t num_states) {
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  const size_t hk = static_cast<size_t>(p.H) * p.K;
  Problem contiguous = p;
  for (int64_t n = 0; n < p.N; ++n) {
    if (!has_init.empty() && has_init[n] == 0) {
      std::fill_n(contiguous.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, 0.0F);
    }
  }
  const Result want = RunChunk(contiguous, impl);
  const PoolResult got = RunChunkPool(p, impl, idx, has_init, num_states);
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

TEST_F(KdaOptimizedTest, PoolFormMatchesContiguousForm) {
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
  const std::vector<uint8_t> has_init = {1, 0, 1, 1, 0, 0};
  {
    SCOPED_TRACE("reference");
    ExpectPoolMatchesContiguous(p, Impl::kReference, idx, has_init, 8);
    ExpectPoolMatchesContiguous(p, Impl::kReference, idx, {}, 8);
  }
  ForEachIsa([&] {
    ExpectPoolMatchesContiguous(p, Impl::kOptimized, idx, has_init, 8);
    ExpectPoolMatchesContiguous(p, Impl::kOptimized, idx, {}, 8);
  });
}

TEST_F(KdaOptimizedTest, PoolPaddingWritesZerosAndTouchesNoState) {
  // Padding sequences with and without tokens (indices -1 and -3), mixed with
  // live ones; slot 0, the dummy slot, is never used.
  Spec s;
  s.lengths = {4, 0, 7, 3, 40};
  s.H = 2;
  s.K = 16;
  s.seed = 411;
  const Problem p = MakeProblem(s);
  const std::vector<int32_t> idx = {2, -1, 5, -3, 1};
  const std::vector<uint8_t> has_init = {1, 1, 0, 1, 1};
  {
    SCOPED_TRACE("reference");
    ExpectPoolMatchesContiguous(p, Impl::kReference, idx, has_init, 6);
  }
  ForEachIsa([&] { ExpectPoolMatchesContiguous(p, Impl::kOptimized, idx, has_init, 6); });
}

TEST_F(KdaOptimizedTest, PoolFormOptimizedMatchesReference) {
  Spec s;
  s.lengths = {130, 1, 0, 65, 33};
  s.H = 4;
  s.K = 64;
  s.gate = GateKind::kStress;
  s.l2norm_in_kernel = true;
  s.seed = 421;
  const Problem p = MakeProblem(s);
  const std::vector<int32_t> idx = {4, 9, -1, 1, 6};
  const std::vector<uint8_t> has_init = {1, 0, 0, 1, 0};
  // The exact output of the bf16 runs: the fp32 reference on the same
  // bf16-rounded q/k/v (g and beta stay fp32 in both).
  Problem p16 = p;
  for (std::vector<float>* x : {&p16.q, &p16.k, &p16.v}) {
    for (float& e : *x) e = RoundBF16(e);
  }
  const PoolResult exact16 = RunChunkPool(p16, Impl::kReference, idx, has_init, 10);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const PoolResult want = RunChunkPool(p, Impl::kReference, idx, has_init, 10, dt);
    ForEachIsa([&] {
      const PoolResult got = RunChunkPool(p, Impl::kOptimized, idx, has_init, 10, dt);
      EXPECT_TRUE(testing::AllFinite(got.o));
      if (dt == DType::kF32) {
        EXPECT_TRUE(AllCloseF32(got.o.data(), want.o.data(), want.o.size())) << "outputs";
      } else {
        EXPECT_TRUE(AllCloseBF16(got.o.data(), want.o.data(), exact16.o.data(), want.o.size())) << "outputs";
      }
      EXPECT_TRUE(AllCloseF32(got.pool.data(), want.pool.data(), want.pool.size())) << "pool";
    });
  }
}

TEST_F(KdaOptimizedTest, HasInitialStateInContiguousForm) {
  // has_initial_state[n] == 0 starts sequence n from zeros whatever its
  // initial_state holds, aliased or not; same bits as a zeroed initial state.
  Spec s;
  s.lengths = {5, 0, 40, 0};
  s.H = 2;
  s.K = 32;
  s.seed = 431;
  const Problem p = MakeProblem(s);
  const std::vector<uint8_t> has_init = {0, 0, 1, 1};
  const size_t per = static_cast<size_t>(p.H) * p.K * p.K;
  Problem zeroed = p;
  for (int64_t n : {0, 1}) std::fill_n(zeroed.h0.begin() + static_cast<std::ptrdiff_t>(n * per), per, 0.0F);
  auto run = [&](Impl impl, bool alias) {
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
    if (impl == Impl::kReference) {
      chunk_kda_reference(a);
    } else {
      chunk_kda_optimized(a);
    }
    return Result{o.ToF32(), final_state};
  };
  for (bool alias : {false, true}) {
    SCOPED_TRACE(alias ? "aliased" : "separate");
    ExpectBitEqual(run(Impl::kReference, alias), RunChunk(zeroed, Impl::kReference));
    ForEachIsa([&] { ExpectBitEqual(run(Impl::kOptimized, alias), RunChunk(zeroed, Impl::kOptimized)); });
  }
}

// ------------------------------------------------- validation and ISA selection

TEST_F(KdaOptimizedTest, ValidatesBeforeWriting) {
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

TEST_F(KdaOptimizedTest, IsaNamesAndSupport) {
  for (KernelIsa isa : {KernelIsa::kAuto, KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    EXPECT_EQ(ParseKernelIsa(KernelIsaName(isa)), isa);
  }
  ExpectErrorContaining([] { ParseKernelIsa("sse"); },
                        "unknown kernel ISA 'sse' (expected auto, generic, avx2 or avx512)");
  EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kGeneric));
  EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kAuto));
  EXPECT_NE(BestKernelIsa(), KernelIsa::kAuto);
  EXPECT_TRUE(CpuSupportsKernelIsa(BestKernelIsa()));
  if (CpuSupportsKernelIsa(KernelIsa::kAvx512)) {
    EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kAvx2));
  }
}

TEST_F(KdaOptimizedTest, IsaOverrideThroughApiAndEnvironment) {
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
  for (KernelIsa isa : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
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
  ExpectErrorContaining([&] { RunChunk(p, Impl::kOptimized); }, "KDA_ISA");
  EXPECT_EQ(ResolveKernelImpl(KernelImpl::kReference), KernelImpl::kReference);
  for (KernelIsa isa : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuSupportsKernelIsa(isa)) continue;
    setenv("KDA_ISA", KernelIsaName(isa), 1);
    internal::ResetKernelIsaForTesting();
    ExpectErrorContaining([] { ActiveKernelIsa(); }, "is not supported by this");
  }
}

}  // namespace
}  // namespace kda
