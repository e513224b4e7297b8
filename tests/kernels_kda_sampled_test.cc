// A sampled option matrix of the KDA core kernels: cases drawn with fixed
// seeds from the whole option space of chunk_kda and fused_recurrent_kda
// (kda_args.h), each run by the reference and by the optimized kernels in
// every ISA the CPU supports (tests/kernel_matrix.h) and checked against the
// float64 recurrence (NaiveRecurrenceF64) at the fp32 tolerance. A case in
// bfloat16 or float16 (q/k/v/o, or g/beta) is first held to the dtype rule of
// the matrix: the fp32 run of the same kernel on the same input values, its
// output (and h) rounded once, its states identical; that fp32 run meets the
// float64 recurrence.
//
// What a case draws: q/k/v and g/beta dtypes; H in 1..4, HV = m * H (m in
// 1..3); K and V in [1, 256] (register-width edges, 60 and 100 among them,
// mostly K != V); packed sequences with cu_seqlens (int64 or int32; empty and
// one-token sequences, lengths around the kernels' blocks) or [B, T] rows;
// the gate's width: a decay per key dimension (KDA, g [T, HV, K]) or, in
// about two cases of five, one per value head (GDN, g [T, HV]: then m in
// 1..4 and loud gates too, down to -60 per step; these draws come from a
// stream of their own, so the KDA cases are those drawn before it existed);
// the log gate (mild, stress: down to -250 per step, or zero) or the in-kernel
// gate (softplus with A_log, fla's sigmoid gate with lower_bound with or
// without A_log, dt_bias [HV*K], [HV, K], [HV] (a scalar gate) or absent;
// chunk_kda's safe_gate);
// beta as given, its sigmoid, 2 sigmoid (allow_neg_eigval), per value
// (fused_recurrent_kda); the in-kernel L2 norm; an explicit scale;
// state_v_first; the thread count; q, k, v as slices of a fused projection.
// chunk_kda: contiguous states (initial state or none, output_final_state or
// not, the initial buffer also the final one) or the pool form (padding
// indices, unused slots), has_initial_state, return_intermediate_states with
// chunk_size 32 or 64. fused_recurrent_kda: several tokens per sequence;
// contiguous states (in place, into a new buffer, or none), the pool with
// 1-D ssm_state_indices (padding; the final state to slot [n]) or 2-D ones
// (a slot per token, -1 not written, num_accepted_tokens, a sequence reading
// and writing one slot), in place or a state per token into final_state.
// States never read (fresh sequences' slots, write-only slots) hold NaN.
//
// A failure's trace names the case: its index and every parameter; a test
// stops at its first failing case. The
// default run draws kCases cases per kernel (a handful under the
// sanitizers); KDA_FULL_MATRIX=1 draws kFullCases; KDA_MATRIX_CASE=i runs
// case i alone (the same draw in every mode).
// Test names: KdaSampledMatrix.{Chunk,Recurrent}MatchesFloat64Recurrence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/base/f16.h"
#include "kda/kernels/chunk_kda_reference.h"
#include "kda/kernels/fused_recurrent_kda_reference.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_optimized.h"
#include "tests/kda_problem.h"
#include "tests/kernel_matrix.h"
#include "tests/thread_scope.h"
#include "tests/tolerance.h"

namespace kda {
namespace {

using testing::AllCloseF32;
using testing::AllCloseStateF32;
using testing::AllFinite;
using testing::AllVariants;
using testing::BitEqual;
using testing::GateKind;
using testing::kSentinel;
using testing::NaiveRecurrenceF64;
using testing::Problem;
using testing::Result;
using testing::RoundedOnce;
using testing::Spec;
using testing::ThreadScope;
using testing::Typed;
using testing::TypedInputs;
using testing::Variant;
using testing::VariantName;
using testing::VariantScope;

// ------------------------------------------------- how many cases

// Cases per kernel: the default run, KDA_FULL_MATRIX=1, the sanitizer build.
constexpr int kCases = 250;
constexpr int kFullCases = 2000;
constexpr int kSanitizedCases = 3;
// The work of a case, in state elements updated (tokens x HV x K x V): its
// sequences are cut to fit.
#ifdef KDA_SANITIZED
constexpr int64_t kWorkBudget = int64_t{1} << 18;
#else
constexpr int64_t kWorkBudget = int64_t{3} << 19;
#endif

bool FullMatrix() {
  const char* env = std::getenv("KDA_FULL_MATRIX");
  return env != nullptr && std::string(env) == "1";
}

// The case indices to run.
std::vector<int> CaseIndices() {
  if (const char* env = std::getenv("KDA_MATRIX_CASE"); env != nullptr && *env != '\0') {
    return {std::atoi(env)};
  }
#ifdef KDA_SANITIZED
  int n = kSanitizedCases;
#else
  int n = kCases;
#endif
  if (FullMatrix()) n = kFullCases;
  std::vector<int> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

// ------------------------------------------------- drawing

class Draw {
 public:
  explicit Draw(uint32_t seed) : rng_(seed) {}
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <class T>
  T Pick(std::initializer_list<T> xs) {
    return xs.begin()[Int(0, static_cast<int>(xs.size()) - 1)];
  }
  uint32_t Seed() { return static_cast<uint32_t>(rng_()); }

 private:
  std::mt19937 rng_;
};

// A head dim in [1, 256]: mostly the edges of the kernels' registers and
// column blocks (and fla's odd sizes 60, 100), else any.
int HeadDim(Draw& d) {
  static constexpr int kEdges[] = {1,  2,  3,  4,  5,  7,  8,  9,   15,  16,  17,  24,  31,  32,  33, 40,
                                   48, 60, 63, 64, 65, 80, 96, 100, 127, 128, 129, 160, 192, 255, 256};
  if (d.Chance(0.15)) return d.Pick({60, 100});
  if (d.Chance(0.6)) return kEdges[d.Int(0, static_cast<int>(std::size(kEdges)) - 1)];
  return d.Int(1, 256);
}

// What both kernels' cases draw.
struct Common {
  int index = 0;
  Spec spec;  // head shape, options, sequence lengths, the inputs' seed
  DType qkv = DType::kF32;
  DType gb = DType::kF32;
  bool rows = false;  // [B, T] rows without cu_seqlens
  DType cu_dtype = DType::kI64;
  bool dt_bias = true;
  bool dt_bias_2d = false;  // [HV, K]
  int threads = 1;
  int64_t fused_pad = -1;  // >= 0: q, k, v slices of a fused projection
};

void DrawCommon(Draw& d, bool recurrent, Common& c) {
  Spec& s = c.spec;
  s.H = d.Int(1, 4);
  s.HV = s.H * d.Int(1, 3);
  s.K = HeadDim(d);
  s.V = d.Chance(0.25) ? s.K : HeadDim(d);
  c.qkv = d.Pick({DType::kF32, DType::kBF16, DType::kF16});
  c.gb = d.Chance(0.6) ? c.qkv : d.Pick({DType::kF32, DType::kBF16, DType::kF16});
  s.gate_in_kernel = d.Chance(0.45);
  s.gate = s.gate_in_kernel ? d.Pick({GateKind::kMild, GateKind::kStress})
                            : d.Pick({GateKind::kMild, GateKind::kStress, GateKind::kStress, GateKind::kNone});
  if (s.gate_in_kernel) {
    switch (d.Int(0, 2)) {
      case 0:  // -exp(A_log) softplus(x)
        break;
      case 1:  // lower_bound sigmoid(exp(A_log) x)
        s.lower_bound = d.Pick({-5.0F, -3.0F, -1.0F, -0.25F, -8.0F});
        break;
      default:  // lower_bound sigmoid(x)
        s.lower_bound = d.Pick({-5.0F, -2.0F, -0.5F, -7.0F});
        s.no_a_log = true;
        break;
    }
    c.dt_bias = d.Chance(0.8);
    c.dt_bias_2d = c.dt_bias && d.Chance(0.3);
  }
  s.l2norm_in_kernel = d.Chance(0.5);
  switch (d.Int(0, 2)) {
    case 0:
      break;
    case 1:
      s.beta_sigmoid = true;
      break;
    default:
      s.beta_sigmoid = true;
      s.allow_neg_eigval = true;
      break;
  }
  s.beta_per_value = recurrent && d.Chance(0.3);
  if (d.Chance(0.2)) s.scale = d.Pick({0.05F, 0.3F, 1.0F});
  s.state_v_first = d.Chance(0.5);
  s.initial_state = false;  // the cases set their states up
  c.threads = d.Pick({1, 1, 2, 3});
  c.fused_pad = d.Chance(0.2) ? d.Pick({0, 3, 8}) : -1;
  c.cu_dtype = d.Chance(0.3) ? DType::kI32 : DType::kI64;
  s.seed = d.Seed();
  // The gate's width, from a stream of its own (see the file comment).
  Draw w(0x6D4E5EEDU + static_cast<uint32_t>(c.index) * 7919U + (recurrent ? 1U : 0U));
  s.scalar_gate = w.Chance(0.4);
  if (s.scalar_gate) {
    s.HV = s.H * w.Int(1, 4);
    if (s.gate_in_kernel) {
      s.gate = w.Pick({GateKind::kMild, GateKind::kLoud, GateKind::kLoud, GateKind::kStress});
    } else {
      s.gate = w.Pick({GateKind::kMild, GateKind::kLoud, GateKind::kLoud, GateKind::kStress, GateKind::kNone});
    }
    c.dt_bias_2d = false;  // one bias per value head: [HV]
  }
}

// The tokens a case may have: its work within kWorkBudget.
int64_t MaxTokens(const Spec& s) {
  const int64_t per_token = static_cast<int64_t>(s.HV) * s.K * s.V;
  return std::max<int64_t>(1, kWorkBudget / per_token);
}

// At most max_sequences sequences (the last ones dropped), at least one.
void FitSequences(std::vector<int64_t>& lengths, int64_t max_sequences) {
  if (static_cast<int64_t>(lengths.size()) > std::max<int64_t>(1, max_sequences)) {
    lengths.resize(static_cast<size_t>(std::max<int64_t>(1, max_sequences)));
  }
}

// The states a case's buffers may hold in all (pool slots, or a state per sequence).
int64_t MaxStates(const Spec& s) { return std::max<int64_t>(1, 2 * MaxTokens(s)); }

// Lengths cut (in proportion) to at most max_tokens in all.
void FitLengths(std::vector<int64_t>& lengths, int64_t max_tokens) {
  int64_t total = 0;
  for (int64_t len : lengths) total += len;
  if (total <= max_tokens) return;
  for (int64_t& len : lengths) len = len * max_tokens / total;
}

// Lengths or [B, T] rows (equal lengths, c.rows).
void DrawLengths(Draw& d, Common& c, int max_sequences, const std::vector<int>& weights_empty_one_block_long,
                 int long_max, int64_t max_tokens) {
  std::vector<int64_t>& lengths = c.spec.lengths;
  const auto one = [&] {
    int r = d.Int(0, 99);
    for (size_t kind = 0; kind < weights_empty_one_block_long.size(); ++kind) {
      if (r < weights_empty_one_block_long[kind]) {
        switch (kind) {
          case 0:
            return int64_t{0};
          case 1:
            return int64_t{1};
          case 2: {
            // Around the blocks: the recurrent chunk form's 8 tokens, the prefill's 32, the chunks of 32 and 64.
            const int len = d.Pick({2, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 96, 97, 128, 129});
            return static_cast<int64_t>(len <= long_max ? len : d.Int(2, long_max));
          }
          default:
            return static_cast<int64_t>(d.Int(2, long_max));
        }
      }
      r -= weights_empty_one_block_long[kind];
    }
    return static_cast<int64_t>(d.Int(2, long_max));
  };
  c.rows = d.Chance(0.25);
  if (c.rows) {
    const int b = d.Int(1, std::min(4, max_sequences));
    const int64_t len = std::min<int64_t>(std::max<int64_t>(one(), 1), std::max<int64_t>(1, max_tokens / b));
    lengths.assign(static_cast<size_t>(b), len);
    return;
  }
  lengths.resize(static_cast<size_t>(d.Int(1, max_sequences)));
  for (int64_t& len : lengths) len = one();
  FitLengths(lengths, max_tokens);
}

std::string Join(const std::vector<int32_t>& xs) {
  std::string r = "{";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i > 0) r += ',';
    r += std::to_string(xs[i]);
  }
  return r + "}";
}
std::string Join(const std::vector<uint8_t>& xs) {
  std::vector<int32_t> w(xs.begin(), xs.end());
  return Join(w);
}

std::string DescribeCommon(const char* kernel, const Common& c) {
  std::string spec = testing::Describe(c.spec);
  spec.erase(spec.find(" no-h0"), 6);  // the states are the case's own (below)
  std::string r = std::string("case ") + std::to_string(c.index) + " (KDA_MATRIX_CASE=" + std::to_string(c.index) +
                  "): " + kernel + " " + spec;
  if (c.spec.scale > 0) r += " scale=" + std::to_string(c.spec.scale);
  if (c.spec.gate_in_kernel) {
    r += !c.dt_bias           ? " no-dt_bias"
         : c.dt_bias_2d       ? " dt_bias[HV,K]"
         : c.spec.scalar_gate ? " dt_bias[HV]"
                              : " dt_bias[HV*K]";
  }
  r +=
      std::string(" seed=") + std::to_string(c.spec.seed) + " q/k/v=" + DTypeName(c.qkv) + " g/beta=" + DTypeName(c.gb);
  r += c.rows ? " [B,T]-rows" : std::string(" cu_seqlens=") + DTypeName(c.cu_dtype);
  r += " threads=" + std::to_string(c.threads);
  if (c.fused_pad >= 0) r += " fused-qkv-pad=" + std::to_string(c.fused_pad);
  return r;
}

// The case's inputs: q, k, v rounded to its q/k/v dtype, g and beta to its
// g/beta dtype; dt_bias empty when absent (zeros for the oracle).
Problem CaseProblem(const Common& c) {
  Problem p = testing::MakeProblem(c.spec);
  if (!c.dt_bias) p.dt_bias.clear();
  for (std::vector<float>* x : {&p.q, &p.k, &p.v}) {
    for (float& e : *x) e = RoundedOnce(c.qkv, e);
  }
  for (std::vector<float>* x : {&p.g, &p.beta}) {
    for (float& e : *x) e = RoundedOnce(c.gb, e);
  }
  return p;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// n states of p's shape: random values (0.5 N(0, 1)).
std::vector<float> RandomStates(const Problem& p, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0F, 0.5F);
  std::vector<float> r(static_cast<size_t>(n) * p.HV * p.HeadState());
  for (float& x : r) x = normal(rng);
  return r;
}

size_t PerState(const Problem& p) { return static_cast<size_t>(p.HV) * p.HeadState(); }

// A case's call and what it views: the case's thread count (set while it lives), the token inputs (q/k/v in qkv,
// g/beta in gb), the output (sentinels) and the int32 boundaries; the call holds the token views, sequences and
// options.
template <class Call>
struct CaseCall {
  CaseCall(const Common& c, const Problem& p, DType qkv, DType gb)
      : threads(c.threads),
        in(p, qkv, gb),
        o(static_cast<size_t>(p.T) * p.ValueRow(), qkv, kSentinel),
        cu32(p.cu.begin(), p.cu.end()) {
    const int64_t rows = c.rows ? p.N : 1;
    call = testing::TokenCall<Call>(p, in, o.Mut(), rows, rows > 0 ? p.T / rows : 0);
    if (!c.rows) {
      call.cu_seqlens = c.cu_dtype == DType::kI64 ? ContiguousView<const void*>(p.cu.data(), DType::kI64, {p.N + 1})
                                                  : ContiguousView<const void*>(cu32.data(), DType::kI32, {p.N + 1});
    }
    if (p.gate_in_kernel && !c.dt_bias) call.dt_bias = {};
    if (p.gate_in_kernel && c.dt_bias_2d) {
      call.dt_bias = ContiguousView<const void*>(p.dt_bias.data(), DType::kF32, {p.HV, p.K});
    }
  }

  const ThreadScope threads;
  const TypedInputs in;
  Typed o;
  const std::vector<int32_t> cu32;
  Call call;
};

// The case's call (q, k and v first moved into a fused projection with its fused_pad) bound and run by the
// variant's implementation of the kernel: `optimized` or `reference`.
template <class Call, class Args>
void RunVariant(const Variant& v, const Common& c, Call& call, Args (*bind)(const Call&),
                void (*optimized)(const Args&), void (*reference)(const Args&)) {
  std::optional<testing::FusedQkv> fused;
  if (c.fused_pad >= 0) fused.emplace(call, c.fused_pad);
  (v.optimized() ? optimized : reference)(bind(call));
}

// What a run leaves: the output, the state buffer it writes (chunk_kda: the
// final states, the initial buffer when aliased, or the pool;
// fused_recurrent_kda: the initial buffer in place, the final states, or the
// pool), the state buffer it only reads (contiguous initial states), and h
// (chunk_kda's intermediate states; fused_recurrent_kda's state per token).
struct Outcome {
  std::vector<float> o;
  std::vector<float> states;
  std::vector<float> initial;
  std::vector<float> h;
};

// The dtype rule: a run in half precision is the fp32 run of the same kernel
// on the same values, every state identical, the output rounded once (and h
// when it is in q/k/v's dtype).
void ExpectFp32RunRounded(const Outcome& half, const Outcome& f32, DType qkv, bool h_in_qkv) {
  ASSERT_EQ(half.o.size(), f32.o.size());
  for (size_t i = 0; i < f32.o.size(); ++i) ASSERT_EQ(half.o[i], RoundedOnce(qkv, f32.o[i])) << "output " << i;
  ASSERT_EQ(half.states.size(), f32.states.size());
  EXPECT_TRUE(BitEqual(half.states.data(), f32.states.data(), f32.states.size())) << "states";
  ASSERT_EQ(half.initial.size(), f32.initial.size());
  EXPECT_TRUE(BitEqual(half.initial.data(), f32.initial.data(), f32.initial.size())) << "initial states";
  ASSERT_EQ(half.h.size(), f32.h.size());
  for (size_t i = 0; i < f32.h.size(); ++i) {
    ASSERT_EQ(half.h[i], h_in_qkv ? RoundedOnce(qkv, f32.h[i]) : f32.h[i]) << "h " << i;
  }
}

// The outputs: live sequences' rows against the float64 recurrence (fp32
// rule), padding sequences' rows exactly zero.
void ExpectOutputs(const Problem& p, const std::vector<bool>& padding, const std::vector<float>& got,
                   const std::vector<float>& want) {
  const size_t row = p.ValueRow();
  std::vector<float> expected = want;
  for (int64_t n = 0; n < p.N; ++n) {
    if (!padding[n]) continue;
    for (size_t i = static_cast<size_t>(p.cu[n]) * row; i < static_cast<size_t>(p.cu[n + 1]) * row; ++i) {
      ASSERT_EQ(got[i], 0.0F) << "padding sequence " << n << "'s output";
      expected[i] = 0.0F;
    }
  }
  EXPECT_TRUE(AllFinite(got));
  EXPECT_TRUE(AllCloseF32(got.data(), expected.data(), got.size())) << "outputs";
}

// Slot by slot: written slots (expected[slot] set) close to the expected
// state, every other slot bit for bit as it was.
void ExpectSlots(const std::vector<float>& got, const std::vector<float>& before,
                 const std::vector<std::optional<std::vector<float>>>& expected, size_t per, const char* what) {
  ASSERT_EQ(got.size(), before.size());
  for (size_t slot = 0; slot < expected.size(); ++slot) {
    const float* g = got.data() + slot * per;
    if (expected[slot]) {
      EXPECT_TRUE(AllCloseF32(g, expected[slot]->data(), per)) << what << " " << slot;
    } else {
      EXPECT_TRUE(BitEqual(g, before.data() + slot * per, per)) << what << " " << slot << " written";
    }
  }
}

std::vector<float> StateOf(const std::vector<float>& states, size_t i, size_t per) {
  return {states.begin() + static_cast<std::ptrdiff_t>(i * per),
          states.begin() + static_cast<std::ptrdiff_t>((i + 1) * per)};
}

// ------------------------------------------------- chunk_kda

struct ChunkCase : Common {
  bool pool = false;
  bool initial = false;  // contiguous: an initial state
  bool alias = false;    // contiguous: the initial state buffer is the final one
  bool output_final_state = true;
  std::vector<uint8_t> has_init;  // empty: not given
  std::vector<int32_t> idx;       // pool: [N]
  int64_t num_states = 0;
  bool safe_gate = false;
  bool intermediate = false;
  int chunk_size = 64;
};

ChunkCase DrawChunkCase(int index) {
  Draw d(0xC0FFEEU + static_cast<uint32_t>(index) * 7919U);
  ChunkCase c;
  c.index = index;
  DrawCommon(d, false, c);
  DrawLengths(d, c, 6, {12, 10, 30}, 150, MaxTokens(c.spec));
  FitSequences(c.spec.lengths, MaxStates(c.spec) - 3);
  const auto n = static_cast<int64_t>(c.spec.lengths.size());
  c.pool = d.Chance(0.4);
  if (c.pool) {
    c.num_states = n + d.Int(0, 3);
    std::vector<int32_t> slots(static_cast<size_t>(c.num_states));
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(d.Seed()));
    for (int64_t i = 0; i < n; ++i) c.idx.push_back(d.Chance(0.2) ? d.Pick({-1, -1, -2, -7}) : slots[i]);
    c.output_final_state = d.Chance(0.5);  // ignored by the pool form
  } else {
    c.initial = d.Chance(0.75);
    c.output_final_state = d.Chance(0.8);
    c.alias = c.initial && d.Chance(0.5);
  }
  if (d.Chance(0.4)) {
    for (int64_t i = 0; i < n; ++i) c.has_init.push_back(d.Chance(0.6) ? 1 : 0);
  }
  const Spec& s = c.spec;
  if (s.gate_in_kernel && s.lower_bound < 0.0F && s.lower_bound >= -5.0F) {
    c.safe_gate = d.Chance(0.5);
  } else if (!s.gate_in_kernel) {
    c.safe_gate = d.Chance(0.1);  // asks nothing without the in-kernel gate
  }
  c.intermediate = d.Chance(0.35);
  c.chunk_size = d.Pick({32, 64});
  return c;
}

std::string Describe(const ChunkCase& c) {
  std::string r = DescribeCommon("chunk_kda", c);
  if (c.pool) {
    r += " pool S=" + std::to_string(c.num_states) + " state_indices=" + Join(c.idx);
    r += c.output_final_state ? " output_final_state" : "";
  } else {
    r += c.initial ? (c.alias ? " initial_state=final_state" : " initial_state") : " no-initial_state";
    r += c.output_final_state ? " output_final_state" : " no-final_state";
  }
  if (!c.has_init.empty()) r += " has_initial_state=" + Join(c.has_init);
  if (c.safe_gate) r += " safe_gate";
  r += " chunk_size=" + std::to_string(c.chunk_size);
  if (c.intermediate) r += " return_intermediate_states";
  return r;
}

// `slots` random states (0.5 N(0, 1), drawn from the case's seed), NaN in every slot no sequence reads
// (SlotRead).
template <class Case>
std::vector<float> StatesRead(const Case& c, const Problem& p, int64_t slots) {
  std::mt19937 rng(c.spec.seed + 1);
  const size_t per = PerState(p);
  std::vector<float> r = RandomStates(p, slots, rng);
  std::vector<bool> read(static_cast<size_t>(slots), false);
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t slot = SlotRead(c, n);
    if (slot >= 0) read[slot] = true;
  }
  for (int64_t slot = 0; slot < slots; ++slot) {
    if (!read[slot]) std::fill_n(r.begin() + static_cast<std::ptrdiff_t>(slot * per), per, kNaN);
  }
  return r;
}

// The problem the float64 recurrence runs: each sequence from the state it reads (or zeros).
template <class Case>
Problem OracleProblem(const Case& c, const Problem& p, const std::vector<float>& states0) {
  const size_t per = PerState(p);
  Problem r = p;
  r.h0.assign(p.StateSize(), 0.0F);
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t slot = SlotRead(c, n);
    if (states0.empty() || slot < 0) continue;
    std::copy_n(states0.begin() + static_cast<std::ptrdiff_t>(slot * per), per,
                r.h0.begin() + static_cast<std::ptrdiff_t>(n * per));
  }
  return r;
}

bool ChunkReads(const ChunkCase& c, int64_t n) { return c.has_init.empty() || c.has_init[n] != 0; }

// The state slot sequence n starts from: -1 for none (zeros, or a padding sequence).
int64_t SlotRead(const ChunkCase& c, int64_t n) {
  const int64_t slot = c.pool ? c.idx[n] : n;
  return slot >= 0 && ChunkReads(c, n) ? slot : -1;
}

// The state buffer before the call: contiguous [N] (NaN where
// has_initial_state is 0), the pool [S] (NaN in every slot not read), or none.
std::vector<float> States0(const ChunkCase& c, const Problem& p) {
  if (!c.pool && !c.initial) return {};
  return StatesRead(c, p, c.pool ? c.num_states : p.N);
}

int64_t NumChunks(const Problem& p, int chunk_size) {
  int64_t nt = 0;
  for (int64_t n = 0; n < p.N; ++n) nt += (p.cu[n + 1] - p.cu[n] + chunk_size - 1) / chunk_size;
  return nt;
}

Outcome RunCase(const Variant& v, const ChunkCase& c, const Problem& p, const std::vector<float>& states0, DType qkv,
                DType gb) {
  CaseCall<ChunkKdaCall> made(c, p, qkv, gb);
  ChunkKdaCall& call = made.call;
  call.safe_gate = c.safe_gate;
  call.chunk_size = c.chunk_size;
  call.output_final_state = c.output_final_state;
  Outcome r;
  if (c.pool) {
    r.states = states0;
    call.state = testing::MutStatesView(p, r.states.data(), c.num_states);
    call.state_indices = ContiguousView<const void*>(c.idx.data(), DType::kI32, {p.N});
  } else {
    if (c.alias) {
      r.states = states0;
    } else {
      r.initial = states0;
      if (c.output_final_state) r.states.assign(p.StateSize(), kSentinel);
    }
    if (c.initial) call.initial_state = testing::StatesView(p, c.alias ? r.states.data() : r.initial.data(), p.N);
    if (c.output_final_state) call.final_state = testing::MutStatesView(p, r.states.data(), p.N);
  }
  if (!c.has_init.empty()) call.has_initial_state = ContiguousView<const void*>(c.has_init.data(), DType::kU8, {p.N});
  const int64_t nt = NumChunks(p, c.chunk_size);
  std::optional<Typed> h;
  if (c.intermediate) {
    h.emplace(static_cast<size_t>(nt) * PerState(p), qkv, kSentinel);
    const int64_t b = c.rows ? p.N : 1;
    const int64_t per_row = b > 0 ? nt / b : 0;
    call.return_intermediate_states = true;
    call.intermediate_states = p.state_v_first
                                   ? ContiguousView<void*>(h->Mut().data, qkv, {b, per_row, p.HV, p.V, p.K})
                                   : ContiguousView<void*>(h->Mut().data, qkv, {b, per_row, p.HV, p.K, p.V});
  }
  RunVariant(v, c, call, BindChunkKda, chunk_kda_optimized, chunk_kda_reference);
  r.o = made.o.ToF32();
  if (h) r.h = h->ToF32();
  return r;
}

void ExpectMatchesOracle(const ChunkCase& c, const Problem& p, const std::vector<float>& states0, const Outcome& got,
                         const Result& want, const std::vector<float>& want_h) {
  const size_t per = PerState(p);
  std::vector<bool> padding(static_cast<size_t>(p.N), false);
  for (int64_t n = 0; c.pool && n < p.N; ++n) padding[n] = c.idx[n] < 0;
  ExpectOutputs(p, padding, got.o, want.o);
  const auto len = [&](int64_t n) { return p.cu[n + 1] - p.cu[n]; };
  // The final state of live sequence n: close to the recurrence's; an empty
  // sequence's exactly its initial state (or zeros).
  const auto expect_final = [&](const float* g, int64_t n) {
    const float* w = want.state.data() + n * per;
    if (len(n) == 0) {
      EXPECT_TRUE(BitEqual(g, w, per)) << "empty sequence " << n << "'s final state";
    } else {
      EXPECT_TRUE(AllCloseF32(g, w, per)) << "sequence " << n << "'s final state";
    }
  };
  if (c.pool) {
    std::vector<bool> written(static_cast<size_t>(c.num_states), false);
    for (int64_t n = 0; n < p.N; ++n) {
      if (c.idx[n] < 0) continue;
      written[c.idx[n]] = true;
      expect_final(got.states.data() + c.idx[n] * per, n);
    }
    for (int64_t slot = 0; slot < c.num_states; ++slot) {
      if (!written[slot]) {
        EXPECT_TRUE(BitEqual(got.states.data() + slot * per, states0.data() + slot * per, per))
            << "slot " << slot << " written";
      }
    }
  } else if (c.output_final_state) {
    for (int64_t n = 0; n < p.N; ++n) expect_final(got.states.data() + n * per, n);
  } else if (c.alias) {
    // Read, not written: the initial buffer as it was.
    EXPECT_TRUE(BitEqual(got.states.data(), states0.data(), states0.size())) << "initial_state written";
  }
  if (!c.pool && !c.alias) {
    EXPECT_TRUE(BitEqual(got.initial.data(), states0.data(), states0.size())) << "initial_state written";
  }
  if (c.intermediate) {
    ASSERT_EQ(got.h.size(), want_h.size());
    std::vector<float> expected = want_h;
    int64_t chunk = 0;
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t chunks = (len(n) + c.chunk_size - 1) / c.chunk_size;
      if (padding[n]) {
        for (size_t i = static_cast<size_t>(chunk) * per; i < static_cast<size_t>(chunk + chunks) * per; ++i) {
          ASSERT_EQ(got.h[i], 0.0F) << "padding sequence " << n << "'s h";
          expected[i] = 0.0F;
        }
      }
      chunk += chunks;
    }
    EXPECT_TRUE(AllFinite(got.h));
    EXPECT_TRUE(AllCloseStateF32(got.h.data(), expected.data(), expected.size())) << "h";
  }
}

// Each case drawn by `draw` against the float64 recurrence in every variant: the fp32 run against
// `oracle(c, p, states0, along)` (the recurrence's result; `along` its states along the way: chunk_kda's h,
// fused_recurrent_kda's state after every token) and, in half precision, the fp32 run rounded once (h too with
// h_in_qkv). Stops at the first failing case and variant.
template <class Case, class Oracle>
void CheckSampledCases(Case (*draw)(int), Oracle oracle, bool h_in_qkv) {
  for (int index : CaseIndices()) {
    const Case c = draw(index);
    SCOPED_TRACE(Describe(c));
    const Problem p = CaseProblem(c);
    const std::vector<float> states0 = States0(c, p);
    std::vector<float> along;
    const Result want = oracle(c, p, states0, along);
    for (const Variant& v : AllVariants()) {
      SCOPED_TRACE(VariantName(v));
      const VariantScope scope(v);
      try {
        const Outcome f32 = RunCase(v, c, p, states0, DType::kF32, DType::kF32);
        ExpectMatchesOracle(c, p, states0, f32, want, along);
        if (c.qkv != DType::kF32 || c.gb != DType::kF32) {
          SCOPED_TRACE("the fp32 run rounded once");
          ExpectFp32RunRounded(RunCase(v, c, p, states0, c.qkv, c.gb), f32, c.qkv, h_in_qkv);
        }
      } catch (const Error& e) {
        ADD_FAILURE() << "refused: " << e.what();
      }
      if (::testing::Test::HasFailure()) return;  // stop at the first failing case and variant
    }
  }
}

TEST(KdaSampledMatrix, ChunkMatchesFloat64Recurrence) {
  CheckSampledCases(
      DrawChunkCase,
      [](const ChunkCase& c, const Problem& p, const std::vector<float>& states0, std::vector<float>& want_h) {
        return NaiveRecurrenceF64(OracleProblem(c, p, states0), c.chunk_size, c.intermediate ? &want_h : nullptr);
      },
      true);
}

// ------------------------------------------------- fused_recurrent_kda

enum class StateForm { kContiguous, kSlots, kSlotsPerToken };

struct RecurrentCase : Common {
  StateForm form = StateForm::kContiguous;
  bool initial = true;  // contiguous: initial_state given
  bool inplace = true;  // inplace_final_state
  bool output_final_state = false;
  std::vector<int32_t> idx;  // [N, cols]
  int64_t cols = 1;
  std::vector<int32_t> accepted;  // [N] num_accepted_tokens; empty: not given
  int64_t num_states = 0;
};

int32_t ReadSlot(const RecurrentCase& c, int64_t n) {
  const int64_t col = c.accepted.empty() ? 0 : c.accepted[n] - 1;
  return c.idx[n * c.cols + col];
}

RecurrentCase DrawRecurrentCase(int index) {
  Draw d(0xDEC0DEU + static_cast<uint32_t>(index) * 7919U);
  RecurrentCase c;
  c.index = index;
  DrawCommon(d, true, c);
  c.form = d.Pick({StateForm::kContiguous, StateForm::kSlots, StateForm::kSlotsPerToken});
  c.inplace = d.Chance(0.65);
  c.output_final_state = d.Chance(0.7);  // ignored in place
  const int64_t max_tokens = MaxTokens(c.spec);
  // Decode steps (one token), speculative verification (a few), longer runs
  // (the optimized kernel's chunk form: 8 tokens at a time), empty sequences.
  const bool per_token = c.form == StateForm::kSlotsPerToken && c.inplace;
  DrawLengths(d, c, 8, {12, 35, 33}, per_token ? 9 : 40, max_tokens);
  if (!c.rows && d.Chance(0.03)) c.spec.lengths.clear();  // N = 0
  if (c.form == StateForm::kContiguous) {
    FitSequences(c.spec.lengths, MaxStates(c.spec));
    c.initial = c.inplace || d.Chance(0.6);
    return c;
  }
  int64_t max_len = 0;
  for (int64_t len : c.spec.lengths) max_len = std::max(max_len, len);
  if (c.form == StateForm::kSlots) {
    c.cols = 1;
  } else {
    // In place a sequence has at most cols tokens; otherwise the slots past the read one are not used.
    c.cols = c.inplace ? std::max<int64_t>(1, max_len) + d.Int(0, 2) : d.Int(1, 4);
  }
  FitSequences(c.spec.lengths, (MaxStates(c.spec) - 3) / c.cols);
  const auto n = static_cast<int64_t>(c.spec.lengths.size());
  // Distinct slots for the sequences' reads and writes, a few spare.
  c.num_states = std::max<int64_t>(1, n * c.cols + d.Int(0, 3));
  std::vector<int32_t> slots(static_cast<size_t>(c.num_states));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(d.Seed()));
  size_t next = 0;
  c.idx.assign(static_cast<size_t>(n * c.cols), -1);
  // (With C = 1 a bind refuses num_accepted_tokens, though a shape check takes it.)
  if (c.form == StateForm::kSlotsPerToken && c.cols > 1 && d.Chance(0.6)) {
    for (int64_t i = 0; i < n; ++i) c.accepted.push_back(d.Int(1, static_cast<int>(c.cols)));
  }
  std::vector<int32_t> padding_rows;
  for (int64_t i = 0; i < n; ++i) {
    int32_t* row = c.idx.data() + i * c.cols;
    for (int64_t col = 0; col < c.cols; ++col) row[col] = d.Chance(0.2) ? -1 : slots[next++];
    const int64_t read_col = c.accepted.empty() ? 0 : c.accepted[i] - 1;
    if (d.Chance(0.15)) {
      row[read_col] = d.Pick({-1, -1, -3});  // padding
      padding_rows.push_back(static_cast<int32_t>(i));
      continue;
    }
    if (row[read_col] < 0) row[read_col] = slots[next++];
    // A sequence may read and write one slot, or write one slot twice.
    if (c.cols > 1 && d.Chance(0.3)) row[0] = row[read_col];
    if (c.cols > 2 && d.Chance(0.2)) row[2] = row[1];
  }
  // A padding sequence touches no state: give some of them live sequences' slots.
  for (int32_t i : padding_rows) {
    for (int64_t col = 0; col < c.cols; ++col) {
      const int32_t other = c.idx[d.Int(0, static_cast<int>(c.idx.size()) - 1)];
      const int64_t read_col = c.accepted.empty() ? 0 : c.accepted[i] - 1;
      if (col != read_col && other >= 0 && d.Chance(0.5)) c.idx[i * c.cols + col] = other;
    }
  }
  return c;
}

std::string Describe(const RecurrentCase& c) {
  std::string r = DescribeCommon("fused_recurrent_kda", c);
  switch (c.form) {
    case StateForm::kContiguous:
      r += c.initial ? " initial_state" : " no-initial_state";
      break;
    case StateForm::kSlots:
      r += " pool S=" + std::to_string(c.num_states) + " ssm_state_indices[N]=" + Join(c.idx);
      break;
    case StateForm::kSlotsPerToken:
      r += " pool S=" + std::to_string(c.num_states) + " ssm_state_indices[N," + std::to_string(c.cols) +
           "]=" + Join(c.idx);
      if (!c.accepted.empty()) r += " num_accepted_tokens=" + Join(c.accepted);
      break;
  }
  r += c.inplace ? " inplace_final_state" : (c.output_final_state ? " output_final_state" : " no-final_state");
  return r;
}

bool Padding(const RecurrentCase& c, int64_t n) { return c.form != StateForm::kContiguous && ReadSlot(c, n) < 0; }

int64_t SlotRead(const RecurrentCase& c, int64_t n) { return c.form == StateForm::kContiguous ? n : ReadSlot(c, n); }

// The state buffer before the call: contiguous [N] random (none without an
// initial state), the pool [S] with random read slots, NaN in the others.
std::vector<float> States0(const RecurrentCase& c, const Problem& p) {
  const bool contiguous = c.form == StateForm::kContiguous;
  if (contiguous && !c.initial) return {};
  return StatesRead(c, p, contiguous ? p.N : c.num_states);
}

Outcome RunCase(const Variant& v, const RecurrentCase& c, const Problem& p, const std::vector<float>& states0,
                DType qkv, DType gb) {
  const bool pool = c.form != StateForm::kContiguous;
  CaseCall<RecurrentKdaCall> made(c, p, qkv, gb);
  RecurrentKdaCall& call = made.call;
  call.inplace_final_state = c.inplace;
  call.output_final_state = c.output_final_state;
  Outcome r;
  // In place the states go to the buffer read (`states`); otherwise it stays
  // `initial` and the final states (a state per token with the pool) go to a
  // new buffer.
  std::vector<float>& read = c.inplace ? r.states : r.initial;
  read = states0;
  if (pool || c.initial) call.initial_state = testing::MutStatesView(p, read.data(), pool ? c.num_states : p.N);
  if (pool) {
    // N = 0: an empty index tensor, at a valid address (null data there is refused as "no indices").
    static constexpr int32_t kNoIndex = 0;
    const int32_t* idx = c.idx.empty() ? &kNoIndex : c.idx.data();
    call.ssm_state_indices = c.form == StateForm::kSlots ? ContiguousView<const void*>(idx, DType::kI32, {p.N})
                                                         : ContiguousView<const void*>(idx, DType::kI32, {p.N, c.cols});
    if (!c.accepted.empty()) {
      call.num_accepted_tokens = ContiguousView<const void*>(c.accepted.data(), DType::kI32, {p.N});
    }
  }
  if (!c.inplace && c.output_final_state) {
    std::vector<float>& dst = pool ? r.h : r.states;
    const int64_t rows = pool ? p.T : p.N;
    dst.assign(static_cast<size_t>(rows) * PerState(p), kSentinel);
    call.final_state = testing::MutStatesView(p, dst.data(), rows);
  }
  RunVariant(v, c, call, BindRecurrentKda, fused_recurrent_kda_optimized, fused_recurrent_kda_reference);
  r.o = made.o.ToF32();
  return r;
}

void ExpectMatchesOracle(const RecurrentCase& c, const Problem& p, const std::vector<float>& states0,
                         const Outcome& got, const Result& want, const std::vector<float>& want_tokens) {
  const size_t per = PerState(p);
  std::vector<bool> padding(static_cast<size_t>(p.N), false);
  for (int64_t n = 0; n < p.N; ++n) padding[n] = Padding(c, n);
  ExpectOutputs(p, padding, got.o, want.o);
  const auto len = [&](int64_t n) { return p.cu[n + 1] - p.cu[n]; };
  if (c.form == StateForm::kContiguous) {
    if (c.inplace || c.output_final_state) {
      // In place an empty sequence's state stays as it was; into a new
      // buffer it is its initial state (or zeros). Either way want.state's.
      ASSERT_EQ(got.states.size(), want.state.size());
      for (int64_t n = 0; n < p.N; ++n) {
        const float* g = got.states.data() + n * per;
        const float* w = want.state.data() + n * per;
        if (len(n) == 0) {
          EXPECT_TRUE(BitEqual(g, w, per)) << "empty sequence " << n << "'s final state";
        } else {
          EXPECT_TRUE(AllCloseF32(g, w, per)) << "sequence " << n << "'s final state";
        }
      }
    }
    if (!c.inplace) {
      EXPECT_TRUE(BitEqual(got.initial.data(), states0.data(), states0.size())) << "initial_state written";
    }
    return;
  }
  // The pool: in place, the slots written (last write wins), the others as they were.
  std::vector<std::optional<std::vector<float>>> expected(static_cast<size_t>(c.num_states));
  for (int64_t n = 0; c.inplace && n < p.N; ++n) {
    if (padding[n]) continue;
    for (int64_t t = 0; t < len(n); ++t) {
      const int32_t slot = c.form == StateForm::kSlots ? (t == len(n) - 1 ? c.idx[n] : -1) : c.idx[n * c.cols + t];
      if (slot >= 0) expected[slot] = StateOf(want_tokens, p.cu[n] + t, per);
    }
  }
  ExpectSlots(c.inplace ? got.states : got.initial, states0, expected, per, "slot");
  if (!c.inplace && c.output_final_state) {
    // The state after every token into row bos + t; padding sequences' rows untouched.
    std::vector<std::optional<std::vector<float>>> rows(static_cast<size_t>(p.T));
    const std::vector<float> sentinels(static_cast<size_t>(p.T) * per, kSentinel);
    for (int64_t n = 0; n < p.N; ++n) {
      for (int64_t t = p.cu[n]; t < p.cu[n + 1] && !padding[n]; ++t) rows[t] = StateOf(want_tokens, t, per);
    }
    ExpectSlots(got.h, sentinels, rows, per, "final_state row");
  }
}

TEST(KdaSampledMatrix, RecurrentMatchesFloat64Recurrence) {
  CheckSampledCases(
      DrawRecurrentCase,
      [](const RecurrentCase& c, const Problem& p, const std::vector<float>& states0, std::vector<float>& want_tokens) {
        return NaiveRecurrenceF64(OracleProblem(c, p, states0), 64, nullptr, &want_tokens);
      },
      false);
}

}  // namespace
}  // namespace kda
