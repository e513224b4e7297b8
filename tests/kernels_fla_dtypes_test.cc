// What fla (0.6.0) takes beyond one dtype: q, k and v each in its own float
// dtype, and float16 / bfloat16 initial states (fused_recurrent_kda and the
// Gated DeltaNet entries; fla's chunk_kda asserts float32). chunk_kda and
// fused_recurrent_kda run such a call on float32 copies: each result equals,
// bit for bit, the float32 call on the widened values, o rounded once into
// fla's dtype (q's for the chunk entries, v's for the recurrent ones) and a
// float16 / bfloat16 pool written back rounded; what they refuse writes
// nothing; a bind refuses such a call (the kernels' arguments hold one dtype).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "tests/error_util.h"
#include "tests/kda_problem.h"

namespace kda {
namespace {

using testing::MakeProblem;
using testing::Problem;
using testing::Typed;
using testing::TypedInputs;

// Each value of x rounded to `t` and back (what the kernels read of a `t` tensor).
std::vector<float> Rounded(const std::vector<float>& x, DType t) { return Typed(x, t).ToF32(); }

// The token dtypes of a case: q, k, v.
struct Dtypes {
  DType q, k, v;
};

const Dtypes kMixed[] = {
    {DType::kF32, DType::kF32, DType::kF16},    // fla's tests: float32 q, k with float16 v
    {DType::kBF16, DType::kF32, DType::kF16},   // three dtypes
    {DType::kF16, DType::kBF16, DType::kBF16},  // o in q's (chunk) or v's (recurrent) dtype
};

Problem MixedProblem(bool scalar_gate) {
  return MakeProblem({.lengths = {5, 70, 1},
                      .H = 2,
                      .K = 32,
                      .gate = testing::GateKind::kStress,
                      .seed = 41,
                      .HV = 4,
                      .V = 16,
                      .scalar_gate = scalar_gate});
}

// The inputs in `d`'s dtypes (g and beta fp32), and the same values widened to fp32.
struct Inputs {
  Inputs(const Problem& p, const Dtypes& d)
      : typed(p, DType::kF32, DType::kF32),
        wide(Rounded(p.q, d.q), Rounded(p.k, d.k), Rounded(p.v, d.v), p.g, p.beta, DType::kF32, DType::kF32) {
    typed.q = Typed(p.q, d.q);
    typed.k = Typed(p.k, d.k);
    typed.v = Typed(p.v, d.v);
  }
  TypedInputs typed;
  TypedInputs wide;
};

TEST(FlaDtypes, ChunkReadsEachTokenTensorInItsOwnDtype) {
  for (const bool gdn : {false, true}) {
    const Problem p = MixedProblem(gdn);
    for (const Dtypes& d : kMixed) {
      for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
        SCOPED_TRACE(std::string(gdn ? "chunk_gated_delta_rule " : "chunk_kda ") + DTypeName(d.q) + "/" +
                     DTypeName(d.k) + "/" + DTypeName(d.v) + " " + KernelImplName(impl));
        const Inputs in(p, d);
        const auto run = [&](const TypedInputs& t, DType o_dtype) {
          Typed o(static_cast<size_t>(p.T) * p.ValueRow(), o_dtype, testing::kSentinel);
          std::vector<float> state(p.StateSize(), testing::kSentinel);
          ChunkKdaCall c = testing::ChunkCallFor(p, t, o.Mut());
          c.entry = gdn ? DeltaRuleEntry::kGatedDeltaRule : DeltaRuleEntry::kKda;
          testing::SetStates(p, c, p.h0.data(), state.data());
          EXPECT_EQ(NeedsFloat32Copies(c), &t == &in.typed);
          chunk_kda(c, impl);
          return testing::Result{o.ToF32(), state};
        };
        const testing::Result got = run(in.typed, d.q);  // o in q's dtype, as fla
        const testing::Result want = run(in.wide, DType::kF32);
        testing::ExpectBitEqual(got, {Rounded(want.o, d.q), want.state});
      }
    }
  }
}

TEST(FlaDtypes, RecurrentReadsEachTokenTensorAndTheStatesInTheirOwnDtype) {
  for (const bool gdn : {false, true}) {
    const Problem p = MixedProblem(gdn);
    for (const Dtypes& d : kMixed) {
      for (const DType pool_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
          SCOPED_TRACE(std::string(gdn ? "gated delta rule " : "kda ") + DTypeName(d.q) + "/" + DTypeName(d.k) + "/" +
                       DTypeName(d.v) + " pool " + DTypeName(pool_dtype) + " " + KernelImplName(impl));
          const Inputs in(p, d);
          // The pool [S = N + 2, HV, K, V]: each sequence updates its slot in place (fla's _fwd entry).
          const std::vector<int32_t> slots = {2, 0, 3};
          std::vector<float> pool0(static_cast<size_t>(p.N + 2) * p.HV * p.K * p.V);
          for (size_t i = 0; i < pool0.size(); ++i) pool0[i] = 0.01F * static_cast<float>(i % 97) - 0.4F;
          pool0 = Rounded(pool0, pool_dtype);  // the values the narrow pool holds
          const auto run = [&](const TypedInputs& t, DType o_dtype, DType state_dtype) {
            Typed o(static_cast<size_t>(p.T) * p.ValueRow(), o_dtype, testing::kSentinel);
            Typed pool(pool0, state_dtype);
            RecurrentKdaCall c = testing::TokenCall<RecurrentKdaCall>(p, t, o.Mut(), 1, p.T);
            c.entry = gdn ? DeltaRuleEntry::kGatedDeltaRule : DeltaRuleEntry::kKda;
            c.cu_seqlens = ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1});
            c.initial_state = ContiguousView<void*>(pool.Mut().data, state_dtype, {p.N + 2, p.HV, p.K, p.V});
            c.ssm_state_indices = ContiguousView<const void*>(slots.data(), DType::kI32, {p.N});
            fused_recurrent_kda(c, impl);
            return testing::Result{o.ToF32(), pool.ToF32()};
          };
          const testing::Result got = run(in.typed, d.v, pool_dtype);  // o in v's dtype, as fla
          const testing::Result want = run(in.wide, DType::kF32, DType::kF32);
          testing::ExpectBitEqual(got, {Rounded(want.o, d.v), Rounded(want.state, pool_dtype)});
        }
      }
    }
  }
}

TEST(FlaDtypes, GatedDeltaRuleChunkTakesANarrowInitialStateAndChunkKdaRefusesIt) {
  const Problem p = MixedProblem(/*scalar_gate=*/true);
  const TypedInputs in(p, DType::kBF16, DType::kF32);
  for (const DType h0 : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(h0));
    const Typed narrow(p.h0, h0);
    const std::vector<float> h0_wide = narrow.ToF32();
    const auto run = [&](DeltaRuleEntry entry, const TensorView& initial) {
      Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kBF16, testing::kSentinel);
      std::vector<float> state(p.StateSize(), testing::kSentinel);
      ChunkKdaCall c = testing::ChunkCallFor(p, in, o.Mut());
      c.entry = entry;
      testing::SetStates(p, c, nullptr, state.data());
      c.initial_state = initial;
      chunk_kda(c, KernelImpl::kOptimized);
      return testing::Result{o.ToF32(), state};
    };
    const TensorView narrow_view = narrow.View({p.N, p.HV, p.K, p.V});
    testing::ExpectBitEqual(run(DeltaRuleEntry::kGatedDeltaRule, narrow_view),
                            run(DeltaRuleEntry::kGatedDeltaRule, testing::StatesView(p, h0_wide.data(), p.N)));
    // fla's chunk_kda asserts a float32 initial state: refused, nothing written.
    Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kBF16, testing::kSentinel);
    std::vector<float> state(p.StateSize(), testing::kSentinel);
    ChunkKdaCall c = testing::ChunkCallFor(p, in, o.Mut());
    testing::SetStates(p, c, nullptr, state.data());
    c.initial_state = narrow_view;
    testing::ExpectErrorContaining([&] { chunk_kda(c); }, "initial_state: dtype must be float32");
    EXPECT_EQ(state, std::vector<float>(p.StateSize(), testing::kSentinel));
    EXPECT_EQ(o.ToF32(), Typed(static_cast<size_t>(p.T) * p.ValueRow(), DType::kBF16, testing::kSentinel).ToF32());
  }
}

TEST(FlaDtypes, RefusedMixedCallsWriteNothingAndBindsRefuseThem) {
  const Problem p = MixedProblem(/*scalar_gate=*/false);
  const Inputs in(p, kMixed[0]);
  Typed o(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF32, testing::kSentinel);
  std::vector<float> state(p.StateSize(), testing::kSentinel);
  ChunkKdaCall c = testing::ChunkCallFor(p, in.typed, o.Mut());
  testing::SetStates(p, c, p.h0.data(), state.data());
  testing::ExpectErrorContaining([&] { BindChunkKda(c); }, "must have one dtype and float32 here");
  // o in another dtype than fla's (q's), and bad boundaries: refused before any copy is written back.
  c.o.dtype = DType::kF16;
  testing::ExpectErrorContaining([&] { chunk_kda(c); }, "o: dtype must be q's (float32), got float16");
  c.o.dtype = DType::kF32;
  const std::vector<int64_t> bad_cu = {0, 5, 3, p.T};
  c.cu_seqlens = ContiguousView<const void*>(bad_cu.data(), DType::kI64, {p.N + 1});
  EXPECT_THROW(chunk_kda(c), Error);
  EXPECT_EQ(state, std::vector<float>(p.StateSize(), testing::kSentinel));
  EXPECT_EQ(o.ToF32(), std::vector<float>(static_cast<size_t>(p.T) * p.ValueRow(), testing::kSentinel));
  // The recurrent entries return o in v's dtype.
  RecurrentKdaCall r = testing::TokenCall<RecurrentKdaCall>(p, in.typed, o.Mut(), 1, p.T);
  r.cu_seqlens = ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1});
  r.inplace_final_state = false;
  testing::ExpectErrorContaining([&] { fused_recurrent_kda(r); }, "o: dtype must be v's (float16), got float32");
  testing::ExpectErrorContaining([&] { BindRecurrentKda(r); }, "o: dtype must be v's (float16), got float32");
  // A tensor without data is refused before anything is copied (found by the call fuzzer).
  Typed o16(static_cast<size_t>(p.T) * p.ValueRow(), DType::kF16, testing::kSentinel);
  r.o = ContiguousView<void*>(o16.Mut().data, DType::kF16, {1, p.T, p.HV, p.V});
  r.inplace_final_state = true;
  r.initial_state = ContiguousView<void*>(nullptr, DType::kBF16, {p.N, p.HV, p.K, p.V});
  testing::ExpectErrorContaining([&] { fused_recurrent_kda(r); }, "initial_state is null");
  r.initial_state = ContiguousView<void*>(state.data(), DType::kF32, {p.N, p.HV, p.K, p.V});
  r.k.data = nullptr;
  testing::ExpectErrorContaining([&] { fused_recurrent_kda(r); }, "k is null");
  EXPECT_EQ(state, std::vector<float>(p.StateSize(), testing::kSentinel));
}

}  // namespace
}  // namespace kda
