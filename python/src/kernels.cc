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

// fused_recurrent_kda's initial_state: written only with inplace_final_state, so a read-only array is
// taken as well (and refused where it would be written).
using StateArg = std::optional<std::variant<nb::tuple, nb::ndarray<>, nb::ndarray<nb::ro>>>;

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

// A StateArg as a view; `written`: refused when the array is read-only.
MutTensorView StateView(const StateArg& arg, const char* name, bool written) {
  if (!arg) return MutTensorView{};
  if (const auto* spec = std::get_if<nb::tuple>(&*arg)) return SpecView<MutTensorView>(*spec, name);
  if (const auto* rw = std::get_if<1>(&*arg)) return ArrayView<MutTensorView>(*rw, name);
  if (written) {
    throw nb::value_error((std::string("fused_recurrent_kda: ") + name +
                           ": is read-only, but inplace_final_state=True writes the states into it")
                              .c_str());
  }
  // Read only: the kernel writes nothing through it (checked above).
  const TensorView ro = ArrayView<TensorView>(std::get<2>(*arg), name);
  MutTensorView v;
  v.data = const_cast<void*>(ro.data);
  v.dtype = ro.dtype;
  v.foreign_dtype = ro.foreign_dtype;
  v.ndim = ro.ndim;
  v.strided = ro.strided;
  for (int i = 0; i < kMaxViewDims; ++i) {
    v.shape[i] = ro.shape[i];
    v.strides[i] = ro.strides[i];
  }
  return v;
}

nb::dict ShapesDict(const KdaCallShapes& s) {
  nb::dict d;
  d["B"] = s.B;
  d["T"] = s.T;
  d["N"] = s.N;
  d["H"] = s.H;
  d["HV"] = s.HV;
  d["K"] = s.K;
  d["V"] = s.V;
  d["num_states"] = s.num_states;
  d["num_chunks"] = s.num_chunks;
  d["scalar_gate"] = s.scalar_gate;
  return d;
}

// The entry a call names in its errors: "kda" (chunk_kda, fused_recurrent_kda) or "gated_delta_rule"
// (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule; see DeltaRuleEntry).
DeltaRuleEntry ParseEntry(const std::string& entry) {
  if (entry == "kda") return DeltaRuleEntry::kKda;
  if (entry == "gated_delta_rule") return DeltaRuleEntry::kGatedDeltaRule;
  throw nb::value_error(("entry: expected 'kda' or 'gated_delta_rule', got '" + entry + "'").c_str());
}

// The options both kernels share (fla's names), as the bindings take them.
struct CommonOptions {
  std::optional<float> scale;
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  bool use_beta_sigmoid_in_kernel = false;
  bool allow_neg_eigval = false;
  std::optional<float> lower_bound;
  bool state_v_first = false;
  bool delta_correction = true;  // false: Mamba2's SSD recurrence (KdaCallCommon::delta_correction)
};

// A call of either kernel with the arguments both share: the entry, o, the token tensors and the options.
template <class Call>
Call CommonCall(const std::string& entry, const OutArg& o, const InArg& q, const InArg& k, const InArg& v,
                const InArg& g, const InArg& beta, const CommonOptions& opt, const InArg& cu_seqlens,
                const InArg& a_log, const InArg& dt_bias) {
  Call c;
  c.entry = ParseEntry(entry);
  c.o = ViewOf<MutTensorView>(o, "o");
  c.q = ViewOf<TensorView>(q, "q");
  c.k = ViewOf<TensorView>(k, "k");
  c.v = ViewOf<TensorView>(v, "v");
  c.g = ViewOf<TensorView>(g, "g");
  c.beta = ViewOf<TensorView>(beta, "beta");
  c.scale = opt.scale;
  c.use_qk_l2norm_in_kernel = opt.use_qk_l2norm_in_kernel;
  c.use_gate_in_kernel = opt.use_gate_in_kernel;
  c.use_beta_sigmoid_in_kernel = opt.use_beta_sigmoid_in_kernel;
  c.allow_neg_eigval = opt.allow_neg_eigval;
  c.lower_bound = opt.lower_bound;
  c.state_v_first = opt.state_v_first;
  c.delta_correction = opt.delta_correction;
  c.cu_seqlens = ViewOf<TensorView>(cu_seqlens, "cu_seqlens");
  c.A_log = ViewOf<TensorView>(a_log, "A_log");
  c.dt_bias = ViewOf<TensorView>(dt_bias, "dt_bias");
  return c;
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
                                 bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel, bool allow_neg_eigval,
                                 bool safe_gate, std::optional<float> lower_bound, bool state_v_first,
                                 const InArg& cu_seqlens, const InArg& a_log, const InArg& dt_bias, int chunk_size,
                                 const OutArg& state, const InArg& state_indices, bool return_intermediate_states,
                                 const OutArg& intermediate_states, const std::string& kernel, bool check_only,
                                 const std::string& entry, bool delta_correction) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  auto c = CommonCall<ChunkKdaCall>(entry, o, q, k, v, g, beta,
                                    {scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                                     allow_neg_eigval, lower_bound, state_v_first, delta_correction},
                                    cu_seqlens, a_log, dt_bias);
  c.final_state = ViewOf<MutTensorView>(final_state, "final_state");
  c.initial_state = ViewOf<TensorView>(initial_state, "initial_state");
  c.output_final_state = output_final_state;
  c.safe_gate = safe_gate;
  c.chunk_size = chunk_size;
  c.state = ViewOf<MutTensorView>(state, "state");
  c.state_indices = ViewOf<TensorView>(state_indices, "state_indices");
  c.return_intermediate_states = return_intermediate_states;
  c.intermediate_states = ViewOf<MutTensorView>(intermediate_states, "intermediate_states");
  return CheckOrRun(c, impl, check_only, CheckChunkKdaShapes,
                    [](const ChunkKdaCall& call, KernelImpl i) { chunk_kda(call, i); });
}

std::optional<nb::dict> FusedRecurrentKda(const OutArg& o, const OutArg& final_state, const InArg& q, const InArg& k,
                                          const InArg& v, const InArg& g, const InArg& beta, const InArg& a_log,
                                          const InArg& dt_bias, const StateArg& initial_state,
                                          std::optional<float> scale, bool output_final_state, bool inplace_final_state,
                                          bool state_v_first, const InArg& cu_seqlens, const InArg& ssm_state_indices,
                                          const InArg& num_accepted_tokens, bool use_qk_l2norm_in_kernel,
                                          bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel,
                                          bool allow_neg_eigval, std::optional<float> lower_bound,
                                          const std::string& kernel, bool check_only, const std::string& entry,
                                          bool delta_correction) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  auto c = CommonCall<RecurrentKdaCall>(entry, o, q, k, v, g, beta,
                                        {scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                                         allow_neg_eigval, lower_bound, state_v_first, delta_correction},
                                        cu_seqlens, a_log, dt_bias);
  c.initial_state = StateView(initial_state, "initial_state", inplace_final_state);
  c.final_state = ViewOf<MutTensorView>(final_state, "final_state");
  c.output_final_state = output_final_state;
  c.inplace_final_state = inplace_final_state;
  c.ssm_state_indices = ViewOf<TensorView>(ssm_state_indices, "ssm_state_indices");
  c.num_accepted_tokens = ViewOf<TensorView>(num_accepted_tokens, "num_accepted_tokens");
  return CheckOrRun(c, impl, check_only, CheckRecurrentKdaShapes,
                    [](const RecurrentKdaCall& call, KernelImpl i) { fused_recurrent_kda(call, i); });
}

}  // namespace

void BindKernels(nb::module_& m) {
  // The two kernels, one entry each (python/kda/_kernels.py and kda.jax call them): every tensor is None, an array
  // or a (dtype, shape) spec; check_only=True checks the shapes and returns the implied sizes without running.
  m.def("chunk_kda", &ChunkKda, nb::arg("o").none(), nb::arg("final_state").none(), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("scale").none() = nb::none(),
        nb::arg("initial_state").none() = nb::none(), nb::arg("output_final_state") = false,
        nb::arg("use_qk_l2norm_in_kernel") = false, nb::arg("use_gate_in_kernel") = false,
        nb::arg("use_beta_sigmoid_in_kernel") = false, nb::arg("allow_neg_eigval") = false,
        nb::arg("safe_gate") = false, nb::arg("lower_bound").none() = nb::none(), nb::arg("state_v_first") = false,
        nb::arg("cu_seqlens").none() = nb::none(), nb::arg("A_log").none() = nb::none(),
        nb::arg("dt_bias").none() = nb::none(), nb::arg("chunk_size") = 64, nb::arg("state").none() = nb::none(),
        nb::arg("state_indices").none() = nb::none(), nb::arg("return_intermediate_states") = false,
        nb::arg("intermediate_states").none() = nb::none(), nb::arg("kernel") = "auto", nb::arg("check_only") = false,
        nb::arg("entry") = "kda", nb::arg("delta_correction") = true,
        "chunk_kda (kda/kernels/kda_args.h ChunkKdaCall) writing o [B, T, HV, V] and final_state [N, HV, K, V], or "
        "the pool `state` [S, HV, K, V] through state_indices [N] int32, and with return_intermediate_states the "
        "intermediate_states [B, NT, HV, K, V] in k's dtype. g is [B, T, HV, K] (KDA) or [B, T, HV] (GDN's scalar "
        "gate; dt_bias [HV]). entry: 'kda' or 'gated_delta_rule' (chunk_gated_delta_rule: g [B, T, HV] only, "
        "chunk_size 16, 32 or 64), the name errors carry. With check_only, returns {B, T, N, H, HV, K, V, "
        "num_states, num_chunks, scalar_gate} (else None; num_chunks -1 when cu_seqlens has no data). bf16 arrays "
        "may come as DLPack bfloat16 or as uint16 bit views. delta_correction=False runs Mamba2's SSD recurrence "
        "(S += beta k v^T; kda/kernels/kda_args.h KdaCallCommon).");
  m.def("fused_recurrent_kda", &FusedRecurrentKda, nb::arg("o").none(), nb::arg("final_state").none(), nb::arg("q"),
        nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("A_log").none() = nb::none(),
        nb::arg("dt_bias").none() = nb::none(), nb::arg("initial_state").none() = nb::none(),
        nb::arg("scale").none() = nb::none(), nb::arg("output_final_state") = false,
        nb::arg("inplace_final_state") = true, nb::arg("state_v_first") = false,
        nb::arg("cu_seqlens").none() = nb::none(), nb::arg("ssm_state_indices").none() = nb::none(),
        nb::arg("num_accepted_tokens").none() = nb::none(), nb::arg("use_qk_l2norm_in_kernel") = false,
        nb::arg("use_gate_in_kernel") = false, nb::arg("use_beta_sigmoid_in_kernel") = false,
        nb::arg("allow_neg_eigval") = false, nb::arg("lower_bound").none() = nb::none(), nb::arg("kernel") = "auto",
        nb::arg("check_only") = false, nb::arg("entry") = "kda", nb::arg("delta_correction") = true,
        "fused_recurrent_kda_fwd (RecurrentKdaCall): the recurrence token by token; with ssm_state_indices ([N] or "
        "[N, C] int32, negative: padding) the states live in the pool initial_state, otherwise [N, HV, K, V]; "
        "inplace_final_state writes them back there, else final_state receives them (with output_final_state). g is "
        "[B, T, HV, K] (KDA) or [B, T, HV] (GDN's scalar gate; dt_bias [HV]); entry 'kda' or 'gated_delta_rule' "
        "names the call in errors; delta_correction=False: Mamba2's SSD recurrence.");
  m.def(
      "reads_in_place", [](const nb::ndarray<nb::ro>& a) { return ReadsTokensInPlace(ArrayView<TensorView>(a, "x")); },
      nb::arg("x"),
      "Whether the kernels read the token array x (q, k or v, [B, T, heads, dim]) in place: C-contiguous, or "
      "token-strided (strides [T * s, s, dim, 1], s >= heads * dim: a fused projection's columns).");
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
