// XLA FFI handlers of the KDA and Gated DeltaNet kernels for JAX on the CPU
// platform (kda.jax): the typed FFI calls into kda::chunk_kda /
// kda::fused_recurrent_kda (the dispatcher: optimized kernels unless
// KDA_KERNEL says otherwise) on the buffers XLA hands over, as the C++ call
// description (kda/kernels/kda_args.h), which checks them: the same checks
// kda.jax ran at trace time through kda._core (shape-only), and here the
// values too, so that a direct call cannot read out of bounds. Python
// registers the four symbols with jax.ffi.register_ffi_target
// (python/kda/jax/ffi.py).
//
// Targets (inputs in this order, results; q, k [B,T,H,K], v [B,T,HV,V],
// g [B,T,HV,K] (KDA) or [B,T,HV] (a scalar gate per value head: GDN; the
// call description takes the width from g's rank), beta [B,T,HV] (or
// [B,T,HV,V] in the recurrent target), q/k/v each one of f32/bf16/f16 (as
// fla: see NeedsFloat32Copies); states f32 (the initial state also bf16/f16
// where fla takes it)
// [.., HV, K, V], or [.., HV, V, K] with state_v_first; absent optional
// operands are [0] buffers):
//   KdaChunkKda(q, k, v, g, beta, cu_seqlens [N+1] s32 or [0] (B rows), state,
//               state_indices [N] s32 or [0], A_log [HV] f32 or [0],
//               dt_bias [HV*K] ([HV] with a scalar gate) f32 or [0])
//     -> (o [B,T,HV,V] dtype of q, final_state f32, intermediate_states)
//     Contiguous form (pool = false): state is the initial state [N,HV,K,V]
//     or [0] (zeros); final_state is [N,HV,K,V] when output_final_state, else
//     [0]. Pool form (pool = true): state is the pool [S,HV,K,V], aliased to
//     final_state (input_output_aliases {6: 1}); the kernel reads and writes
//     the pool through final_state, which XLA fills with the input first.
//     intermediate_states: with return_intermediate_states fla's h,
//     [B,NT,HV,K,V] in k's dtype (see ChunkKdaCall), else [0].
//   KdaFusedRecurrentKda(q, k, v, g, beta, initial_state, ssm_state_indices
//               [N] or [N,C] s32 or [0], num_accepted_tokens [N] s32 or [0],
//               cu_seqlens, A_log, dt_bias as above, out (o's buffer) or [0])
//     -> (o [B,T,HV,V] dtype of v (aliased to out when given: {11: 0}), states:
//        the pool's dtype with inplace_final_state, else f32)
//     With inplace_final_state the states result is initial_state (the pool,
//     or [N,HV,K,V]), aliased to it ({5: 1}); otherwise initial_state is only
//     read (or [0]: zeros) and the states result is the final_state of
//     RecurrentKdaCall ([N,HV,K,V], or [B*T,HV,K,V] with indices, zeros for
//     padding sequences) with output_final_state, else [0].
// Attributes: has_scale, scale (f32; without has_scale K^-0.5), the flags of
// KdaCallCommon (pred; delta_correction false runs Mamba2's SSD recurrence,
// kda.jax's mamba_ssm names), has_lower_bound, lower_bound (f32),
// output_final_state;
// the chunk target also safe_gate, chunk_size (s32), pool and
// return_intermediate_states, the recurrent
// one inplace_final_state.
// KdaChunkGatedDeltaRule and KdaFusedRecurrentGatedDeltaRule are the same two
// targets for Gated DeltaNet's entries (DeltaRuleEntry::kGatedDeltaRule: errors
// name chunk_gated_delta_rule / fused_recurrent_gated_delta_rule; the chunk
// one takes g [B,T,HV] only and chunk_size 16, 32 or 64).
// cu_seqlens and the indices are int32 (JAX's default integer type; the
// Python side casts int64 inputs); the bind widens cu_seqlens for the kernels.
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The four handler symbols are the library's only exports (built with hidden
// visibility; the static kda library's symbols are not re-exported).
extern "C" {
__attribute__((visibility("default"))) XLA_FFI_Error* KdaChunkKda(XLA_FFI_CallFrame* call_frame);
__attribute__((visibility("default"))) XLA_FFI_Error* KdaFusedRecurrentKda(XLA_FFI_CallFrame* call_frame);
__attribute__((visibility("default"))) XLA_FFI_Error* KdaChunkGatedDeltaRule(XLA_FFI_CallFrame* call_frame);
__attribute__((visibility("default"))) XLA_FFI_Error* KdaFusedRecurrentGatedDeltaRule(XLA_FFI_CallFrame* call_frame);
}

namespace kda {
namespace {

// A view of an XLA buffer (dense, row-major). Optional operands come as [0]
// buffers when absent. Called inside Run: a kda::Error becomes the call's error.
template <class View, class Buffer>
View ViewOf(const Buffer& b, bool optional = false) {
  View v;
  const auto dims = b.dimensions();
  if (optional && dims.size() == 1 && dims[0] == 0) return v;
  Check(dims.size() <= static_cast<size_t>(kMaxViewDims), [&] {
    return "an operand of " + std::to_string(dims.size()) + " dimensions (at most " + std::to_string(kMaxViewDims) +
           ")";
  });
  v.data = b.untyped_data();
  struct Map {
    ffi::DataType xla;
    DType dtype;
  };
  static constexpr Map kMap[] = {
      {ffi::DataType::F32, DType::kF32}, {ffi::DataType::BF16, DType::kBF16}, {ffi::DataType::F16, DType::kF16},
      {ffi::DataType::S32, DType::kI32}, {ffi::DataType::S64, DType::kI64},   {ffi::DataType::U8, DType::kU8},
      {ffi::DataType::S8, DType::kI8},
  };
  v.foreign_dtype = "another XLA element type";
  for (const Map& m : kMap) {
    if (b.element_type() == m.xla) {
      v.dtype = m.dtype;
      v.foreign_dtype = nullptr;
    }
  }
  v.ndim = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) v.shape[i] = dims[i];
  return v;
}

// Runs a kernel call, turning the call's kda::Error into an InvalidArgument
// (the shapes were checked at trace time; values are seen only here).
template <typename F>
ffi::Error Run(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
  return ffi::Error::Success();
}

// The options both targets take, as attributes (optional floats as a flag and a
// value); their names are KDA_OPTION_ATTRS below, in this order.
struct Options {
  bool has_scale = false;
  float scale = 0.0F;
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  bool use_beta_sigmoid_in_kernel = false;
  bool allow_neg_eigval = false;
  bool has_lower_bound = false;
  float lower_bound = 0.0F;
  bool state_v_first = false;
  bool delta_correction = true;  // false: Mamba2's SSD recurrence (KdaCallCommon::delta_correction)
};

// Each target's attributes: the options, then its own (decoded from the call's
// attributes by name, XLA_FFI_REGISTER_STRUCT_ATTR_DECODING below).
struct ChunkAttrs {
  Options opt;
  bool output_final_state = false;
  bool safe_gate = false;
  int32_t chunk_size = 0;
  bool pool = false;
  bool return_intermediate_states = false;
};
struct RecurrentAttrs {
  Options opt;
  bool output_final_state = false;
  bool inplace_final_state = false;
};

// Runs a call of either target (Run): the entry, operands and options both
// share, then the target's own set by `complete`, then its kernel.
template <class Call, class Complete>
ffi::Error RunCall(DeltaRuleEntry entry, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                   const ffi::AnyBuffer& g, const ffi::AnyBuffer& beta, const ffi::AnyBuffer& cu_seqlens,
                   const ffi::AnyBuffer& a_log, const ffi::AnyBuffer& dt_bias, ffi::AnyBuffer& o, const Options& opt,
                   Complete complete) {
  return Run([&] {
    Call c;
    c.entry = entry;
    c.o = ViewOf<MutTensorView>(o);
    c.q = ViewOf<TensorView>(q);
    c.k = ViewOf<TensorView>(k);
    c.v = ViewOf<TensorView>(v);
    c.g = ViewOf<TensorView>(g);
    c.beta = ViewOf<TensorView>(beta);
    if (opt.has_scale) c.scale = opt.scale;
    c.use_qk_l2norm_in_kernel = opt.use_qk_l2norm_in_kernel;
    c.use_gate_in_kernel = opt.use_gate_in_kernel;
    c.use_beta_sigmoid_in_kernel = opt.use_beta_sigmoid_in_kernel;
    c.allow_neg_eigval = opt.allow_neg_eigval;
    if (opt.has_lower_bound) c.lower_bound = opt.lower_bound;
    c.state_v_first = opt.state_v_first;
    c.delta_correction = opt.delta_correction;
    c.cu_seqlens = ViewOf<TensorView>(cu_seqlens, true);
    c.A_log = ViewOf<TensorView>(a_log, true);
    c.dt_bias = ViewOf<TensorView>(dt_bias, true);
    complete(c);
    if constexpr (std::is_same_v<Call, ChunkKdaCall>) {
      chunk_kda(c);
    } else {
      fused_recurrent_kda(c);
    }
  });
}

// The chunk target of an entry (KDA's or Gated DeltaNet's: the name its errors carry).
template <DeltaRuleEntry kEntry>
ffi::Error ChunkImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g, ffi::AnyBuffer beta,
                     ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer state, ffi::AnyBuffer state_indices,
                     ffi::AnyBuffer a_log, ffi::AnyBuffer dt_bias, ffi::Result<ffi::AnyBuffer> o,
                     ffi::Result<ffi::AnyBuffer> final_state, ffi::Result<ffi::AnyBuffer> intermediate_states,
                     const ChunkAttrs& a) {
  const auto own = [&](ChunkKdaCall& c) {
    c.safe_gate = a.safe_gate;
    c.chunk_size = a.chunk_size;
    c.return_intermediate_states = a.return_intermediate_states;
    if (a.return_intermediate_states) c.intermediate_states = ViewOf<MutTensorView>(*intermediate_states);
    if (a.pool) {
      // The pool is read and written through the aliased result.
      c.state = ViewOf<MutTensorView>(*final_state);
      c.state_indices = ViewOf<TensorView>(state_indices);
    } else {
      c.initial_state = ViewOf<TensorView>(state, true);
      c.output_final_state = a.output_final_state;
      if (a.output_final_state) c.final_state = ViewOf<MutTensorView>(*final_state);
    }
  };
  return RunCall<ChunkKdaCall>(kEntry, q, k, v, g, beta, cu_seqlens, a_log, dt_bias, *o, a.opt, own);
}

// The recurrent target of an entry.
template <DeltaRuleEntry kEntry>
ffi::Error FusedRecurrentImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g,
                              ffi::AnyBuffer beta, ffi::AnyBuffer initial_state, ffi::AnyBuffer state_indices,
                              ffi::AnyBuffer num_accepted_tokens, ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer a_log,
                              ffi::AnyBuffer dt_bias, ffi::AnyBuffer /*out: aliased to o when given*/,
                              ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> states,
                              const RecurrentAttrs& a) {
  const auto own = [&](RecurrentKdaCall& c) {
    c.output_final_state = a.output_final_state;
    c.inplace_final_state = a.inplace_final_state;
    c.ssm_state_indices = ViewOf<TensorView>(state_indices, true);
    c.num_accepted_tokens = ViewOf<TensorView>(num_accepted_tokens, true);
    if (a.inplace_final_state) {
      c.initial_state = ViewOf<MutTensorView>(*states);  // aliased to the input
    } else {
      // Only read (inplace_final_state=False writes nothing into it).
      c.initial_state = ViewOf<MutTensorView>(initial_state, true);
      if (a.output_final_state) {
        c.final_state = ViewOf<MutTensorView>(*states);
        // A state per token: the rows of padding sequences stay zeros, as the other front ends allocate them.
        if (c.ssm_state_indices.present()) std::memset(states->untyped_data(), 0, states->size_bytes());
      }
    }
  };
  return RunCall<RecurrentKdaCall>(kEntry, q, k, v, g, beta, cu_seqlens, a_log, dt_bias, *o, a.opt, own);
}

}  // namespace
}  // namespace kda

// The option attributes both targets take, in kda::Options' order (its
// members are initialised from them in turn).
#define KDA_OPTION_ATTRS                                                                                  \
  ffi::StructMember<bool>("has_scale"), ffi::StructMember<float>("scale"),                                \
      ffi::StructMember<bool>("use_qk_l2norm_in_kernel"), ffi::StructMember<bool>("use_gate_in_kernel"),  \
      ffi::StructMember<bool>("use_beta_sigmoid_in_kernel"), ffi::StructMember<bool>("allow_neg_eigval"), \
      ffi::StructMember<bool>("has_lower_bound"), ffi::StructMember<float>("lower_bound"),                \
      ffi::StructMember<bool>("state_v_first"), ffi::StructMember<bool>("delta_correction")

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(kda::ChunkAttrs, KDA_OPTION_ATTRS, ffi::StructMember<bool>("output_final_state"),
                                      ffi::StructMember<bool>("safe_gate"), ffi::StructMember<int32_t>("chunk_size"),
                                      ffi::StructMember<bool>("pool"),
                                      ffi::StructMember<bool>("return_intermediate_states"));
XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(kda::RecurrentAttrs, KDA_OPTION_ATTRS,
                                      ffi::StructMember<bool>("output_final_state"),
                                      ffi::StructMember<bool>("inplace_final_state"));
#undef KDA_OPTION_ATTRS

// The operands both targets take first, in SetCommon's order.
auto BindQKVGBeta() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()   // q
      .Arg<ffi::AnyBuffer>()   // k
      .Arg<ffi::AnyBuffer>()   // v
      .Arg<ffi::AnyBuffer>()   // g
      .Arg<ffi::AnyBuffer>();  // beta
}

// Each target's operands, results and attributes (the same for both entries).
auto BindChunk() {
  return BindQKVGBeta()
      .Arg<ffi::AnyBuffer>()  // cu_seqlens
      .Arg<ffi::AnyBuffer>()  // initial state or pool
      .Arg<ffi::AnyBuffer>()  // state_indices
      .Arg<ffi::AnyBuffer>()  // A_log
      .Arg<ffi::AnyBuffer>()  // dt_bias
      .Ret<ffi::AnyBuffer>()  // o
      .Ret<ffi::AnyBuffer>()  // final state or pool
      .Ret<ffi::AnyBuffer>()  // intermediate states
      .Attrs<kda::ChunkAttrs>();
}

auto BindRecurrent() {
  return BindQKVGBeta()
      .Arg<ffi::AnyBuffer>()  // initial_state
      .Arg<ffi::AnyBuffer>()  // ssm_state_indices
      .Arg<ffi::AnyBuffer>()  // num_accepted_tokens
      .Arg<ffi::AnyBuffer>()  // cu_seqlens
      .Arg<ffi::AnyBuffer>()  // A_log
      .Arg<ffi::AnyBuffer>()  // dt_bias
      .Arg<ffi::AnyBuffer>()  // out
      .Ret<ffi::AnyBuffer>()  // o
      .Ret<ffi::AnyBuffer>()  // states
      .Attrs<kda::RecurrentAttrs>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaChunkKda, kda::ChunkImpl<kda::DeltaRuleEntry::kKda>, BindChunk());
XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaFusedRecurrentKda, kda::FusedRecurrentImpl<kda::DeltaRuleEntry::kKda>,
                              BindRecurrent());
XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaChunkGatedDeltaRule, kda::ChunkImpl<kda::DeltaRuleEntry::kGatedDeltaRule>,
                              BindChunk());
XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaFusedRecurrentGatedDeltaRule,
                              kda::FusedRecurrentImpl<kda::DeltaRuleEntry::kGatedDeltaRule>, BindRecurrent());
