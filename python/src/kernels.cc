// kda._core kernel entry points: chunk_kda and fused_recurrent_kda writing
// into outputs the caller allocated (python/kda/_kernels.py allocates them
// with numpy or torch). The arguments become the C++ call description
// (kda/kernels/kda_args.h), checked there, once: what stays here is Python's
// (None, arrays through DLPack, shape specs of traced values, the GIL).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kda/base/parallel.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "python/src/array_util.h"
#include "python/src/bindings.h"

namespace kda::python {
namespace {

// The element type of a shape-only argument, spelled as numpy / torch / JAX
// spell it ("float32", "bfloat16", ...). Any other name is carried as a
// foreign dtype (the tuple holding the string outlives the call).
template <class View>
void SetDTypeByName(View& v, const char* name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32, DType::kI64, DType::kU8, DType::kI8, DType::kF16}) {
    if (std::strcmp(name, TorchDTypeName(t)) == 0) {
      v.dtype = t;
      return;
    }
  }
  v.foreign_dtype = name;
}

// One tensor argument of a kernel call: None (absent), a (dtype name, shape)
// tuple (shape only: a traced JAX value), or an array read in place through
// DLPack or the buffer protocol. Inputs may be read-only (a JAX array, a
// non-writeable numpy array); outputs must be writable. nanobind converts
// them when it matches the call, so they live for the whole call.
using InArg = std::optional<std::variant<nb::tuple, nb::ndarray<nb::ro>>>;
using OutArg = std::optional<std::variant<nb::tuple, nb::ndarray<>>>;

template <class View>
View SpecView(const nb::tuple& spec, const char* name) {
  View v;
  if (spec.size() != 2) throw nb::type_error((std::string(name) + ": a shape spec is (dtype, shape)").c_str());
  const auto shape = nb::borrow<nb::sequence>(spec[1]);
  const size_t ndim = nb::len(shape);
  if (ndim > static_cast<size_t>(kMaxViewDims)) {
    throw nb::value_error((std::string(name) + ": more than " + std::to_string(kMaxViewDims) + " dimensions").c_str());
  }
  SetDTypeByName(v, nb::cast<const char*>(spec[0]));
  v.ndim = static_cast<int>(ndim);
  for (size_t i = 0; i < ndim; ++i) v.shape[i] = nb::cast<int64_t>(shape[i]);
  return v;
}

template <class View, class Array>
View ArrayView(const Array& a, const char* name) {
  View v;
  if (a.device_type() != nb::device::cpu::value) {
    throw nb::type_error(
        (std::string(name) + ": must be a CPU array (DLPack device type " + std::to_string(a.device_type()) + ")")
            .c_str());
  }
  if (a.ndim() > static_cast<size_t>(kMaxViewDims)) {
    throw nb::value_error((std::string(name) + ": more than " + std::to_string(kMaxViewDims) + " dimensions").c_str());
  }
  v.data = a.data();
  if (!SetDType(v, a.dtype())) v.foreign_dtype = DlpackDTypeName(a.dtype());
  v.ndim = static_cast<int>(a.ndim());
  v.strided = true;
  for (size_t i = 0; i < a.ndim(); ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.strides[i] = a.stride(i);
  }
  return v;
}

template <class View, class Arg>
View ViewOf(const Arg& arg, const char* name) {
  if (!arg) return View{};
  if (const auto* spec = std::get_if<nb::tuple>(&*arg)) return SpecView<View>(*spec, name);
  return ArrayView<View>(std::get<1>(*arg), name);
}

nb::dict ShapesDict(const KdaCallShapes& s) {
  nb::dict d;
  d["B"] = s.B;
  d["T"] = s.T;
  d["N"] = s.N;
  d["H"] = s.H;
  d["K"] = s.K;
  d["V"] = s.V;
  d["num_states"] = s.num_states;
  return d;
}

// The arguments both kernels share: o, the token tensors and the options.
template <class Call>
void SetCommon(Call& c, const OutArg& o, const InArg& q, const InArg& k, const InArg& v, const InArg& g,
               const InArg& beta, std::optional<float> scale, bool use_qk_l2norm_in_kernel, bool use_gate_in_kernel,
               const InArg& cu_seqlens, const InArg& a_log, const InArg& dt_bias) {
  c.o = ViewOf<MutTensorView>(o, "o");
  c.q = ViewOf<TensorView>(q, "q");
  c.k = ViewOf<TensorView>(k, "k");
  c.v = ViewOf<TensorView>(v, "v");
  c.g = ViewOf<TensorView>(g, "g");
  c.beta = ViewOf<TensorView>(beta, "beta");
  c.scale = scale;
  c.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  c.use_gate_in_kernel = use_gate_in_kernel;
  c.cu_seqlens = ViewOf<TensorView>(cu_seqlens, "cu_seqlens");
  c.A_log = ViewOf<TensorView>(a_log, "A_log");
  c.dt_bias = ViewOf<TensorView>(dt_bias, "dt_bias");
}

// The call shape-checked, returning the sizes it implies (check_only), or run
// without the GIL (its bind checks it; nothing is returned).
template <class Call, class CheckFn, class RunFn>
std::optional<nb::dict> CheckOrRun(const Call& c, KernelImpl impl, bool check_only, CheckFn check, RunFn run) {
  if (check_only) return ShapesDict(check(c));
  // Only the views are read from here on; a kda::Error raised without the GIL is translated once it is back.
  nb::gil_scoped_release release;
  run(c, impl);
  return std::nullopt;
}

// The call's arguments in fla's order (plus kda's pool form), each tensor as
// ViewOf takes it. check_only: the shape check only (outputs may be None,
// shape specs allowed); otherwise the kernel runs, without the GIL.
std::optional<nb::dict> ChunkKda(const OutArg& o, const OutArg& final_state, const InArg& q, const InArg& k,
                                 const InArg& v, const InArg& g, const InArg& beta, std::optional<float> scale,
                                 const InArg& initial_state, bool output_final_state, bool use_qk_l2norm_in_kernel,
                                 bool use_gate_in_kernel, const InArg& cu_seqlens, const InArg& a_log,
                                 const InArg& dt_bias, const OutArg& state, const InArg& state_indices,
                                 const std::string& kernel, bool check_only) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  ChunkKdaCall c;
  SetCommon(c, o, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, cu_seqlens, a_log, dt_bias);
  c.final_state = ViewOf<MutTensorView>(final_state, "final_state");
  c.initial_state = ViewOf<TensorView>(initial_state, "initial_state");
  c.output_final_state = output_final_state;
  c.state = ViewOf<MutTensorView>(state, "state");
  c.state_indices = ViewOf<TensorView>(state_indices, "state_indices");
  return CheckOrRun(c, impl, check_only, CheckChunkKdaShapes,
                    [](const ChunkKdaCall& call, KernelImpl i) { chunk_kda(call, i); });
}

std::optional<nb::dict> FusedRecurrentKda(const OutArg& o, const InArg& q, const InArg& k, const InArg& v,
                                          const InArg& g, const InArg& beta, std::optional<float> scale,
                                          const OutArg& initial_state, const InArg& cu_seqlens,
                                          const InArg& ssm_state_indices, bool use_qk_l2norm_in_kernel,
                                          bool use_gate_in_kernel, const InArg& a_log, const InArg& dt_bias,
                                          const std::string& kernel, bool check_only) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  RecurrentKdaCall c;
  SetCommon(c, o, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, cu_seqlens, a_log, dt_bias);
  c.initial_state = ViewOf<MutTensorView>(initial_state, "initial_state");
  c.ssm_state_indices = ViewOf<TensorView>(ssm_state_indices, "ssm_state_indices");
  return CheckOrRun(c, impl, check_only, CheckRecurrentKdaShapes,
                    [](const RecurrentKdaCall& call, KernelImpl i) { fused_recurrent_kda(call, i); });
}

}  // namespace

void BindKernels(nb::module_& m) {
  // The two kernels, one entry each (python/kda/_kernels.py and kda.jax call them): every tensor is None, an array
  // or a (dtype, shape) spec; check_only=True checks the shapes and returns the implied sizes without running.
  m.def("chunk_kda", &ChunkKda, nb::arg("o").none(), nb::arg("final_state").none(), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("scale").none(), nb::arg("initial_state").none(),
        nb::arg("output_final_state"), nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("cu_seqlens").none(), nb::arg("A_log").none(), nb::arg("dt_bias").none(), nb::arg("state").none(),
        nb::arg("state_indices").none(), nb::arg("kernel") = "auto", nb::arg("check_only") = false,
        "chunk_kda (kda/kernels/kda_args.h ChunkKdaCall) writing o [B, T, H, V] and final_state [N, H, K, V], or "
        "the pool `state` [S, H, K, V] through state_indices [N] int32. With check_only, returns {B, T, N, H, K, V, "
        "num_states} (else None). bf16 "
        "arrays may come as DLPack bfloat16 or as uint16 bit views.");
  m.def("fused_recurrent_kda", &FusedRecurrentKda, nb::arg("o").none(), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("g"), nb::arg("beta"), nb::arg("scale").none(), nb::arg("initial_state").none(),
        nb::arg("cu_seqlens").none(), nb::arg("ssm_state_indices").none(), nb::arg("use_qk_l2norm_in_kernel"),
        nb::arg("use_gate_in_kernel"), nb::arg("A_log").none(), nb::arg("dt_bias").none(), nb::arg("kernel") = "auto",
        nb::arg("check_only") = false,
        "fused_recurrent_kda (RecurrentKdaCall): one token per sequence, sequence n updating "
        "initial_state[ssm_state_indices[n]] in place (negative: padding, output zero).");
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
