// kda._core kernel entry points: chunk_kda and fused_recurrent_kda writing
// into outputs the caller allocated (kda/__init__.py allocates them with
// numpy or torch). Every argument is checked before the kernel runs, and the
// kernel itself validates before writing, so a refused call writes nothing.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kda/base/parallel.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "python/src/array_util.h"
#include "python/src/bindings.h"

namespace kda::python {
namespace {

// q, k, v, g, beta and o of either kernel, checked: q/k/g [B, T, H, K], v/o
// [B, T, H, V], beta [B, T, H]; q/k/v one float dtype, o q's dtype.
struct TokenArrays {
  int64_t B = 0, T = 0;
  int H = 0, K = 0, V = 0;
  ConstBuf q, k, v, g, beta;
  MutBuf o;
};

TokenArrays CheckTokenArrays(const OutArray& o, const InArray& q, const InArray& k, const InArray& v, const InArray& g,
                             const InArray& beta) {
  TokenArrays t;
  RequireNdim(q, 4, "q", "[B, T, H, K]");
  RequireNdim(v, 4, "v", "[B, T, H, V]");
  t.B = static_cast<int64_t>(q.shape(0));
  t.T = static_cast<int64_t>(q.shape(1));
  t.H = static_cast<int>(q.shape(2));
  t.K = static_cast<int>(q.shape(3));
  t.V = static_cast<int>(v.shape(3));
  const std::vector<int64_t> qk_shape = {t.B, t.T, t.H, t.K};
  const std::vector<int64_t> v_shape = {t.B, t.T, t.H, t.V};
  RequireShape(k, qk_shape, "k", "[B, T, H, K] (q's shape)");
  RequireShape(v, v_shape, "v", "[B, T, H, V] (B, T, H of q)");
  RequireShape(g, qk_shape, "g", "[B, T, H, K] (q's shape)");
  RequireShape(beta, {t.B, t.T, t.H}, "beta", "[B, T, H]");
  RequireShape(o, v_shape, "o", "[B, T, H, V]");
  const std::pair<const InArray*, const char*> ins[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&g, "g"}, {&beta, "beta"}};
  for (const auto& [a, name] : ins) RequireCpuContiguous(*a, name);
  RequireCpuContiguous(o, "o");
  t.q = {q.data(), FloatDType(q, "q")};
  t.k = {k.data(), FloatDType(k, "k")};
  t.v = {v.data(), FloatDType(v, "v")};
  t.g = {g.data(), FloatDType(g, "g")};
  t.beta = {beta.data(), FloatDType(beta, "beta")};
  t.o = {o.data(), FloatDType(o, "o")};
  if (t.k.dtype != t.q.dtype || t.v.dtype != t.q.dtype) {
    throw nb::type_error((std::string("q, k and v must have one dtype, got ") + ActivationDTypeName(t.q.dtype) + ", " +
                          ActivationDTypeName(t.k.dtype) + ", " + ActivationDTypeName(t.v.dtype))
                             .c_str());
  }
  if (t.o.dtype != t.q.dtype) {
    throw nb::type_error((std::string("o: dtype must be q's (") + ActivationDTypeName(t.q.dtype) + "), got " +
                          ActivationDTypeName(t.o.dtype))
                             .c_str());
  }
  return t;
}

// A_log [H] and dt_bias [H*K] (or [H, K]) as fp32, when use_gate_in_kernel.
void SetGateOptions(KdaOptions& opt, const std::optional<InArray>& a_log, const std::optional<InArray>& dt_bias, int H,
                    int K) {
  if (!opt.use_gate_in_kernel) return;
  if (!a_log) throw nb::value_error("A_log: required with use_gate_in_kernel=True (shape [H])");
  RequireDType(*a_log, DType::kF32, "A_log");
  RequireCpuContiguous(*a_log, "A_log");
  if (static_cast<int64_t>(a_log->size()) != H) {
    throw nb::value_error(
        ("A_log: expected H = " + std::to_string(H) + " elements ([H]), got shape " + ShapeString(ShapeOf(*a_log)))
            .c_str());
  }
  opt.A_log = static_cast<const float*>(a_log->data());
  if (dt_bias) {
    RequireDType(*dt_bias, DType::kF32, "dt_bias");
    RequireCpuContiguous(*dt_bias, "dt_bias");
    if (static_cast<int64_t>(dt_bias->size()) != static_cast<int64_t>(H) * K) {
      throw nb::value_error(("dt_bias: expected H*K = " + std::to_string(static_cast<int64_t>(H) * K) +
                             " elements ([H*K] or [H, K]), got shape " + ShapeString(ShapeOf(*dt_bias)))
                                .c_str());
    }
    opt.dt_bias = static_cast<const float*>(dt_bias->data());
  }
}

// state [S, H, K, V] fp32, writable; S returned.
int64_t CheckStateBuffer(const OutArray& s, const char* name, int H, int K, int V) {
  RequireNdim(s, 4, name, "[S, H, K, V]");
  RequireDType(s, DType::kF32, name);
  RequireCpuContiguous(s, name);
  const int64_t S = static_cast<int64_t>(s.shape(0));
  RequireShape(s, {S, H, K, V}, name, "[S, H, K, V]");
  return S;
}

// int32 [N] state indices.
const int32_t* CheckIndices(const InArray& idx, int64_t N, const char* name) {
  RequireDType(idx, DType::kI32, name);
  RequireCpuContiguous(idx, name);
  RequireShape(idx, {N}, name, "[N]");
  return static_cast<const int32_t*>(idx.data());
}

void ChunkKdaInto(const OutArray& o, const std::optional<OutArray>& final_state, const std::optional<OutArray>& state,
                  const InArray& q, const InArray& k, const InArray& v, const InArray& g, const InArray& beta,
                  const InArray& cu_seqlens, const std::optional<InArray>& initial_state,
                  const std::optional<InArray>& state_indices, float scale, bool use_qk_l2norm_in_kernel,
                  bool use_gate_in_kernel, const std::optional<InArray>& a_log, const std::optional<InArray>& dt_bias,
                  const std::string& kernel) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  const TokenArrays t = CheckTokenArrays(o, q, k, v, g, beta);
  RequireDType(cu_seqlens, DType::kI64, "cu_seqlens");
  RequireCpuContiguous(cu_seqlens, "cu_seqlens");
  RequireNdim(cu_seqlens, 1, "cu_seqlens", "[N + 1]");
  const int64_t N = static_cast<int64_t>(cu_seqlens.shape(0)) - 1;
  if (N < 1) throw nb::value_error("cu_seqlens: expected shape [N + 1] with N >= 1, got [0]");

  ChunkKdaArgs a;
  a.o = t.o;
  a.q = t.q;
  a.k = t.k;
  a.v = t.v;
  a.g = t.g;
  a.beta = t.beta;
  a.T = t.B * t.T;
  a.N = N;
  a.H = t.H;
  a.K = t.K;
  a.V = t.V;
  a.cu_seqlens = static_cast<const int64_t*>(cu_seqlens.data());
  a.options.scale = scale;
  a.options.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  a.options.use_gate_in_kernel = use_gate_in_kernel;
  SetGateOptions(a.options, a_log, dt_bias, t.H, t.K);
  const std::vector<int64_t> nhkv = {N, t.H, t.K, t.V};
  if (state_indices) {
    if (!state) throw nb::value_error("state_indices: needs the state pool (initial_state [S, H, K, V])");
    a.num_states = CheckStateBuffer(*state, "initial_state", t.H, t.K, t.V);
    a.state = static_cast<float*>(state->data());
    a.state_indices = CheckIndices(*state_indices, N, "state_indices");
    a.output_final_state = true;
  } else {
    if (initial_state) {
      RequireDType(*initial_state, DType::kF32, "initial_state");
      RequireCpuContiguous(*initial_state, "initial_state");
      RequireShape(*initial_state, nhkv, "initial_state", "[N, H, K, V]");
      a.initial_state = static_cast<const float*>(initial_state->data());
    }
    a.output_final_state = final_state.has_value();
    if (final_state) {
      RequireDType(*final_state, DType::kF32, "final_state");
      RequireCpuContiguous(*final_state, "final_state");
      RequireShape(*final_state, nhkv, "final_state", "[N, H, K, V]");
      a.final_state = static_cast<float*>(final_state->data());
    }
  }
  ValidateChunkKda(a);  // kda::Error -> ValueError, with the GIL held
  nb::gil_scoped_release release;
  chunk_kda(a, impl);
}

void FusedRecurrentKdaInto(const OutArray& o, const OutArray& state, const InArray& q, const InArray& k,
                           const InArray& v, const InArray& g, const InArray& beta, const InArray& state_indices,
                           float scale, bool use_qk_l2norm_in_kernel, bool use_gate_in_kernel,
                           const std::optional<InArray>& a_log, const std::optional<InArray>& dt_bias,
                           const std::string& kernel) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  const TokenArrays t = CheckTokenArrays(o, q, k, v, g, beta);
  RecurrentKdaArgs a;
  a.o = t.o;
  a.q = t.q;
  a.k = t.k;
  a.v = t.v;
  a.g = t.g;
  a.beta = t.beta;
  a.N = t.B * t.T;  // one token per sequence: [B, T] is N = B*T tokens
  a.H = t.H;
  a.K = t.K;
  a.V = t.V;
  a.num_states = CheckStateBuffer(state, "initial_state", t.H, t.K, t.V);
  a.state = static_cast<float*>(state.data());
  a.state_indices = CheckIndices(state_indices, a.N, "ssm_state_indices");
  a.options.scale = scale;
  a.options.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  a.options.use_gate_in_kernel = use_gate_in_kernel;
  SetGateOptions(a.options, a_log, dt_bias, t.H, t.K);
  ValidateRecurrentKda(a);
  nb::gil_scoped_release release;
  fused_recurrent_kda(a, impl);
}

}  // namespace

void BindKernels(nb::module_& m) {
  m.def("chunk_kda_into", &ChunkKdaInto, nb::arg("o"), nb::arg("final_state").none(), nb::arg("state").none(),
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("cu_seqlens"),
        nb::arg("initial_state").none(), nb::arg("state_indices").none(), nb::arg("scale"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("kernel"),
        "chunk_kda over a packed batch, writing o [B, T, H, V] and final_state [N, H, K, V] (contiguous form) "
        "or the pool `state` [S, H, K, V] through state_indices [N] int32 (pool form). cu_seqlens: int64 "
        "[N + 1] over the B*T packed tokens. bf16 arrays may come as DLPack bfloat16 or as uint16 bit views.");
  m.def("fused_recurrent_kda_into", &FusedRecurrentKdaInto, nb::arg("o"), nb::arg("state"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("state_indices"), nb::arg("scale"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"), nb::arg("A_log").none(),
        nb::arg("dt_bias").none(), nb::arg("kernel"),
        "fused_recurrent_kda: one token per sequence (the B*T tokens of q are N sequences), sequence n "
        "updating state[state_indices[n]] in place (negative: padding, output zero).");
  m.def(
      "set_num_threads",
      [](int n) {
        if (n < 1) throw nb::value_error(("set_num_threads: n must be >= 1, got " + std::to_string(n)).c_str());
        SetNumThreads(n);
      },
      nb::arg("n"), "Threads of the kernels (OpenMP).");
  m.def("get_num_threads", &NumThreads);
  m.def(
      "active_kernel",
      [](const std::string& kernel) { return std::string(ActiveKernelDescription(ParseKernelImpl(kernel))); },
      nb::arg("kernel") = "auto", "What a call with `kernel` runs: 'reference' or 'optimized/<isa>'.");
  m.def(
      "set_kernel_isa", [](const std::string& isa) { SetKernelIsa(ParseKernelIsa(isa)); }, nb::arg("isa"),
      "Forces the instruction set of the optimized kernels: auto | generic | avx2 | avx512 | avx512_shape (a test "
      "variant: AVX-512's code on AVX2).");
}

}  // namespace kda::python
