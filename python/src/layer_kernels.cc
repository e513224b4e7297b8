// kda._core layer kernels beside the delta rule: the short causal conv + SiLU
// over a packed batch (kda/kernels/short_conv.h), the gated RMSNorm with a
// sigmoid or silu gate and Mamba2's over groups of channels
// (kda/kernels/elementwise.h), writing into outputs the caller allocated.
// kda.transformers runs Hugging Face transformers' conv and gated
// norm hooks on them. Every argument is checked here, naming it, before the
// kernel runs without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kda/kernels/elementwise.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/short_conv.h"
#include "python/src/array_util.h"
#include "python/src/bindings.h"

namespace kda::python {
namespace {

// The kda dtype of an activation array (F32 or BF16); TypeError naming it otherwise.
template <class A>
DType ActDType(const A& a, const char* name) {
  struct {
    DType dtype = DType::kF32;
  } got;
  if (!SetDType(got, a.dtype()) || (got.dtype != DType::kF32 && got.dtype != DType::kBF16)) {
    throw nb::type_error(
        (std::string(name) + ": dtype must be float32 or bfloat16, got " + DlpackDTypeName(a.dtype())).c_str());
  }
  return got.dtype;
}

std::string Str(int64_t v) { return std::to_string(v); }

// short_conv_silu: y [T, C] = silu(causal depthwise conv of x [T, C] per sequence of cu_seqlens + bias), the rows
// before a sequence from its tail (tails[tail_indices[n]], [W - 1, C], oldest first) or zero where
// has_initial_state[n] is 0; the new tails written back.
void ShortConvSilu(const OutArray& y, const InArray& x, const InArray& weight, const InArray& cu_seqlens,
                   const OutArray& tails, const InArray& tail_indices, const std::optional<InArray>& has_initial_state,
                   const std::optional<InArray>& bias, const std::string& kernel) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  RequireCpu(x, "x");
  RequireNdim(x, 2, "x", "[T, C]");
  const auto T = static_cast<int64_t>(x.shape(0));
  const auto C = static_cast<int64_t>(x.shape(1));
  if (C > 1 && x.stride(1) != 1) {
    throw nb::value_error(("x: channels must be contiguous (stride 1 in dimension 1), got stride " + Str(x.stride(1)) +
                           " (make a contiguous copy first)")
                              .c_str());
  }
  const int64_t x_row_stride = T > 1 ? x.stride(0) : C;
  if (x_row_stride < C) {
    throw nb::value_error(
        ("x: rows must be at least C = " + Str(C) + " elements apart, got stride " + Str(x_row_stride)).c_str());
  }
  const DType xt = ActDType(x, "x");
  RequireShape(y, {T, C}, "y", "[T, C]");
  const DType yt = ActDType(y, "y");
  RequireCpuContiguous(y, "y");
  RequireNdim(weight, 2, "weight", "[W, C] (tap-major)");
  const auto W = static_cast<int64_t>(weight.shape(0));
  RequireShape(weight, {W, C}, "weight", "[W, C] (tap-major)");
  RequireDType(weight, DType::kF32, "weight");
  RequireCpuContiguous(weight, "weight");
  if (W < 1 || W > 64) throw nb::value_error(("weight: width W must be in [1, 64], got " + Str(W)).c_str());
  RequireNdim(cu_seqlens, 1, "cu_seqlens", "[N + 1]");
  RequireDType(cu_seqlens, DType::kI64, "cu_seqlens");
  RequireCpuContiguous(cu_seqlens, "cu_seqlens");
  const int64_t N = static_cast<int64_t>(cu_seqlens.shape(0)) - 1;
  if (N < 1) throw nb::value_error("cu_seqlens: expected shape [N + 1] with N >= 1, got [1] or []");
  const auto* cu = static_cast<const int64_t*>(cu_seqlens.data());
  if (cu[0] != 0 || cu[N] != T) {
    throw nb::value_error(
        ("cu_seqlens: must run from 0 to T = " + Str(T) + ", got " + Str(cu[0]) + " .. " + Str(cu[N])).c_str());
  }
  for (int64_t n = 0; n < N; ++n) {
    if (cu[n + 1] < cu[n]) throw nb::value_error("cu_seqlens: must be non-decreasing");
  }
  RequireNdim(tails, 3, "tails", "[S, W - 1, C]");
  const auto S = static_cast<int64_t>(tails.shape(0));
  RequireShape(tails, {S, W - 1, C}, "tails", "[S, W - 1, C]");
  RequireDType(tails, xt, "tails");
  RequireCpuContiguous(tails, "tails");
  RequireShape(tail_indices, {N}, "tail_indices", "[N]");
  RequireDType(tail_indices, DType::kI32, "tail_indices");
  RequireCpuContiguous(tail_indices, "tail_indices");
  const auto* idx = static_cast<const int32_t*>(tail_indices.data());
  std::vector<uint8_t> seen(static_cast<size_t>(S), 0);
  for (int64_t n = 0; n < N; ++n) {
    if (idx[n] >= S) {
      throw nb::value_error(("tail_indices: " + Str(idx[n]) + " out of range for " + Str(S) + " tails").c_str());
    }
    if (idx[n] >= 0 && seen[idx[n]]++ != 0) {
      throw nb::value_error(("tail_indices: two sequences share tail " + Str(idx[n])).c_str());
    }
  }
  const uint8_t* fresh = nullptr;
  if (has_initial_state) {
    RequireShape(*has_initial_state, {N}, "has_initial_state", "[N]");
    RequireDType(*has_initial_state, DType::kU8, "has_initial_state");
    RequireCpuContiguous(*has_initial_state, "has_initial_state");
    fresh = static_cast<const uint8_t*>(has_initial_state->data());
  }
  const float* bias_c = nullptr;  // [C] or null
  if (bias) {
    RequireShape(*bias, {C}, "bias", "[C]");
    RequireDType(*bias, DType::kF32, "bias");
    RequireCpuContiguous(*bias, "bias");
    bias_c = static_cast<const float*>(bias->data());
  }
  ShortConvArgs a;
  a.y = {y.data(), yt};
  a.x = {x.data(), xt};
  a.x_row_stride = x_row_stride;
  a.weight = static_cast<const float*>(weight.data());
  a.bias = bias_c;
  a.cu_seqlens = cu;
  a.N = N;
  a.T = T;
  a.C = C;
  a.W = static_cast<int>(W);
  a.tails = {tails.data(), xt};
  a.tail_row_stride = C;
  a.num_tails = S;
  a.tail_indices = idx;
  a.has_initial_state = fresh;
  nb::gil_scoped_release release;
  if (impl == KernelImpl::kReference) {
    short_conv_silu_reference(a);
  } else {
    short_conv_silu(a);
  }
}

// The gate activation named `name` ("sigmoid" or "silu"); ValueError naming it otherwise.
GateActivation ParseGateActivation(const std::string& name) {
  for (GateActivation act : {GateActivation::kSigmoid, GateActivation::kSilu}) {
    if (name == GateActivationName(act)) return act;
  }
  throw nb::value_error(("activation: must be 'sigmoid' or 'silu', got '" + name + "'").c_str());
}

// The rows of a gated RMSNorm call: y, o and the gate `gate_name` [R, C] C-contiguous CPU arrays of
// one activation dtype, weight [C] float32, eps >= 0; R, C and the dtype.
struct NormRows {
  int64_t R = 0;
  int64_t C = 0;
  DType dtype = DType::kF32;
};
NormRows CheckNormRows(const OutArray& y, const InArray& o, const InArray& gate, const char* gate_name,
                       const InArray& weight, float eps) {
  RequireCpu(o, "o");
  RequireNdim(o, 2, "o", "[R, C]");
  NormRows r{static_cast<int64_t>(o.shape(0)), static_cast<int64_t>(o.shape(1)), ActDType(o, "o")};
  RequireCpuContiguous(o, "o");
  RequireShape(gate, {r.R, r.C}, gate_name, "[R, C]");
  RequireDType(gate, r.dtype, gate_name);
  RequireCpuContiguous(gate, gate_name);
  RequireShape(y, {r.R, r.C}, "y", "[R, C]");
  RequireDType(y, r.dtype, "y");
  RequireCpuContiguous(y, "y");
  RequireShape(weight, {r.C}, "weight", "[C]");
  RequireDType(weight, DType::kF32, "weight");
  RequireCpuContiguous(weight, "weight");
  if (r.C < 1 || r.C > (int64_t{1} << 20)) throw nb::value_error(("o: row length C out of range: " + Str(r.C)).c_str());
  if (!(eps >= 0.0F)) throw nb::value_error("eps: must be >= 0");
  return r;
}

// gated_rms_norm: y = o * rsqrt(mean(o^2) + eps) * weight * act(gate) per row of C, fp32 arithmetic.
void GatedRmsNormRows(const OutArray& y, const InArray& o, const InArray& gate, const InArray& weight, float eps,
                      const std::string& activation, const std::string& kernel) {
  const GateActivation act = ParseGateActivation(activation);
  const KernelImpl impl = ParseKernelImpl(kernel);
  const NormRows r = CheckNormRows(y, o, gate, "gate", weight, eps);
  const MutBuf yb{y.data(), r.dtype};
  const ConstBuf ob{o.data(), r.dtype};
  const ConstBuf gb{gate.data(), r.dtype};
  const auto* w = static_cast<const float*>(weight.data());
  const auto V = static_cast<int>(r.C);
  nb::gil_scoped_release release;
  if (impl == KernelImpl::kReference) {
    GatedRmsNormReference(yb, ob, gb, w, r.R, 1, V, eps, act);
  } else {
    GatedRmsNorm(yb, ob, gb, w, r.R, 1, V, eps, act);
  }
}

// gated_rms_norm_groups: Mamba2's, g = o * silu(z), y = g * rsqrt(mean(g^2) + eps) * weight, the mean over
// each of `groups` groups of a row's C channels.
void GatedRmsNormGroupRows(const OutArray& y, const InArray& o, const InArray& z, const InArray& weight, float eps,
                           int64_t groups, const std::string& kernel) {
  const KernelImpl impl = ParseKernelImpl(kernel);
  const NormRows r = CheckNormRows(y, o, z, "z", weight, eps);
  if (groups < 1 || groups > r.C || r.C % groups != 0) {
    throw nb::value_error(("groups: must divide the row length C = " + Str(r.C) + ", got " + Str(groups)).c_str());
  }
  const MutBuf yb{y.data(), r.dtype};
  const ConstBuf ob{o.data(), r.dtype};
  const ConstBuf zb{z.data(), r.dtype};
  const auto* w = static_cast<const float*>(weight.data());
  const int g = static_cast<int>(groups);
  nb::gil_scoped_release release;
  if (impl == KernelImpl::kReference) {
    GatedRmsNormGroupsReference(yb, ob, zb, w, r.R, g, r.C / groups, eps);
  } else {
    GatedRmsNormGroups(yb, ob, zb, w, r.R, g, r.C / groups, eps);
  }
}

}  // namespace

void BindLayerKernels(nb::module_& m) {
  m.def("short_conv_silu", &ShortConvSilu, nb::arg("y"), nb::arg("x"), nb::arg("weight"), nb::arg("cu_seqlens"),
        nb::arg("tails"), nb::arg("tail_indices"), nb::arg("has_initial_state").none() = nb::none(),
        nb::arg("bias").none() = nb::none(), nb::arg("kernel") = "auto",
        "The short causal depthwise conv + SiLU (kda/kernels/short_conv.h) over packed sequences: writes y [T, C] "
        "(float32 or bfloat16, rounded once) from x [T, C] (channels contiguous, rows any stride >= C; float32 or "
        "bfloat16), weight [W, C] float32 tap-major (tap W - 1 multiplies the current token), cu_seqlens [N + 1] "
        "int64. Sequence n reads and writes the tail tails[tail_indices[n]] [W - 1, C] (x's dtype, oldest row "
        "first; tail_indices [N] int32, negative: padding, zero outputs); has_initial_state [N] uint8 (0: the "
        "rows before the sequence are zero; None: every tail is read); bias [C] float32 or None, added to each "
        "channel's sum before the SiLU (Mamba2's conv1d). kernel: 'auto', 'optimized' or 'reference'.");
  m.def("gated_rms_norm", &GatedRmsNormRows, nb::arg("y"), nb::arg("o"), nb::arg("gate"), nb::arg("weight"),
        nb::arg("eps"), nb::arg("activation") = "sigmoid", nb::arg("kernel") = "auto",
        "The gated RMSNorm (kda/kernels/elementwise.h GatedRmsNorm): y = o * rsqrt(mean(o^2) + eps) * weight * "
        "act(gate) per row, fp32 arithmetic in one expression, y rounded once. activation: 'sigmoid', or 'silu' "
        "(gate * sigmoid(gate) in fp32). y, o, gate [R, V] C-contiguous, one dtype (float32 or bfloat16); weight "
        "[V] float32. kernel: 'auto', 'optimized' or 'reference'.");
  m.def("gated_rms_norm_groups", &GatedRmsNormGroupRows, nb::arg("y"), nb::arg("o"), nb::arg("z"), nb::arg("weight"),
        nb::arg("eps"), nb::arg("groups") = 1, nb::arg("kernel") = "auto",
        "Mamba2's gated RMSNorm (kda/kernels/elementwise.h GatedRmsNormGroups; transformers' MambaRMSNormGated, "
        "norm_before_gate=False): g = o * silu(z), y = g * rsqrt(mean(g^2) + eps) * weight, the mean over each "
        "of `groups` equal groups of a row's channels, fp32 arithmetic in one expression, y rounded once. y, o, z "
        "[R, C] C-contiguous, one dtype (float32 or bfloat16); weight [C] float32. kernel: 'auto', 'optimized' "
        "or 'reference'.");
}

}  // namespace kda::python
