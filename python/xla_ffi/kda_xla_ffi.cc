// XLA FFI handlers of the KDA kernels for JAX on the CPU platform (kda.jax):
// the typed FFI calls into kda::chunk_kda / kda::fused_recurrent_kda (the
// dispatcher: optimized kernels unless KDA_KERNEL says otherwise) on the
// buffers XLA hands over, as the C++ call description (kda/kernels/kda_args.h),
// which checks them: the same checks kda.jax ran at trace time through kda._core
// (shape-only), and here the values too, so that a direct call cannot read out
// of bounds. Python registers the two symbols with jax.ffi.register_ffi_target
// (python/kda/jax/ffi.py).
//
// Targets (inputs in this order, results; attributes scale: f32, flags: pred;
// q, k, g [B,T,H,K], v [B,T,H,V], beta [B,T,H], q/k/v one of f32/bf16):
//   KdaChunkKda(q, k, v, g, beta, cu_seqlens [N+1] s32 or [0] (B rows), state f32,
//               state_indices [N] s32 or [0], A_log [H] f32 or [0],
//               dt_bias [H*K] f32 or [0])
//     -> (o [B,T,H,V] dtype of q, final_state f32)
//     Contiguous form (pool = false): state is the initial state [N,H,K,V]
//     or [0] (zeros); final_state is [N,H,K,V] when output_final_state, else
//     [0]. Pool form (pool = true): state is the pool [S,H,K,V], aliased to
//     final_state (input_output_aliases {6: 1}); the kernel reads and writes
//     the pool through final_state, which XLA fills with the input first.
//   KdaFusedRecurrentKda(q, k, v, g, beta, state [S,H,K,V] f32,
//               state_indices [N] s32 (N = B*T, one token per sequence),
//               cu_seqlens [N+1] s32 or [0], A_log, dt_bias as above)
//     -> (o [B,T,H,V], state [S,H,K,V] aliased to input 5)
// cu_seqlens and state_indices are int32 (JAX's default integer type; the
// Python side casts int64 inputs); the bind widens cu_seqlens for the kernels.
#include <cstdint>
#include <exception>
#include <string>

#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The two handler symbols are the library's only exports (built with hidden
// visibility; the static kda library's symbols are not re-exported).
extern "C" {
__attribute__((visibility("default"))) XLA_FFI_Error* KdaChunkKda(XLA_FFI_CallFrame* call_frame);
__attribute__((visibility("default"))) XLA_FFI_Error* KdaFusedRecurrentKda(XLA_FFI_CallFrame* call_frame);
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

// The operands both targets share.
template <class Call>
void SetCommon(Call& c, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
               const ffi::AnyBuffer& g, const ffi::AnyBuffer& beta, const ffi::AnyBuffer& cu_seqlens,
               const ffi::AnyBuffer& a_log, const ffi::AnyBuffer& dt_bias, ffi::AnyBuffer& o, float scale,
               bool use_qk_l2norm_in_kernel, bool use_gate_in_kernel) {
  c.o = ViewOf<MutTensorView>(o);
  c.q = ViewOf<TensorView>(q);
  c.k = ViewOf<TensorView>(k);
  c.v = ViewOf<TensorView>(v);
  c.g = ViewOf<TensorView>(g);
  c.beta = ViewOf<TensorView>(beta);
  c.scale = scale;
  c.use_qk_l2norm_in_kernel = use_qk_l2norm_in_kernel;
  c.use_gate_in_kernel = use_gate_in_kernel;
  c.cu_seqlens = ViewOf<TensorView>(cu_seqlens, true);
  c.A_log = ViewOf<TensorView>(a_log, true);
  c.dt_bias = ViewOf<TensorView>(dt_bias, true);
}

ffi::Error ChunkKdaImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g, ffi::AnyBuffer beta,
                        ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer state, ffi::AnyBuffer state_indices,
                        ffi::AnyBuffer a_log, ffi::AnyBuffer dt_bias, ffi::Result<ffi::AnyBuffer> o,
                        ffi::Result<ffi::AnyBuffer> final_state, float scale, bool use_qk_l2norm_in_kernel,
                        bool use_gate_in_kernel, bool output_final_state, bool pool) {
  return Run([&] {
    ChunkKdaCall c;
    SetCommon(c, q, k, v, g, beta, cu_seqlens, a_log, dt_bias, *o, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel);
    if (pool) {
      // The pool is read and written through the aliased result.
      c.state = ViewOf<MutTensorView>(*final_state);
      c.state_indices = ViewOf<TensorView>(state_indices);
    } else {
      c.initial_state = ViewOf<TensorView>(state, true);
      c.output_final_state = output_final_state;
      if (output_final_state) c.final_state = ViewOf<MutTensorView>(*final_state);
    }
    chunk_kda(c);
  });
}

ffi::Error FusedRecurrentKdaImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g,
                                 ffi::AnyBuffer beta, ffi::AnyBuffer /*state: aliased to state_out*/,
                                 ffi::AnyBuffer state_indices, ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer a_log,
                                 ffi::AnyBuffer dt_bias, ffi::Result<ffi::AnyBuffer> o,
                                 ffi::Result<ffi::AnyBuffer> state_out, float scale, bool use_qk_l2norm_in_kernel,
                                 bool use_gate_in_kernel) {
  return Run([&] {
    RecurrentKdaCall c;
    SetCommon(c, q, k, v, g, beta, cu_seqlens, a_log, dt_bias, *o, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel);
    c.initial_state = ViewOf<MutTensorView>(*state_out);  // the pool, aliased to the input
    c.ssm_state_indices = ViewOf<TensorView>(state_indices);
    fused_recurrent_kda(c);
  });
}

}  // namespace
}  // namespace kda

XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaChunkKda, kda::ChunkKdaImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // g
                                  .Arg<ffi::AnyBuffer>()  // beta
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Arg<ffi::AnyBuffer>()  // initial state or pool
                                  .Arg<ffi::AnyBuffer>()  // state_indices
                                  .Arg<ffi::AnyBuffer>()  // A_log
                                  .Arg<ffi::AnyBuffer>()  // dt_bias
                                  .Ret<ffi::AnyBuffer>()  // o
                                  .Ret<ffi::AnyBuffer>()  // final state or pool
                                  .Attr<float>("scale")
                                  .Attr<bool>("use_qk_l2norm_in_kernel")
                                  .Attr<bool>("use_gate_in_kernel")
                                  .Attr<bool>("output_final_state")
                                  .Attr<bool>("pool"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaFusedRecurrentKda, kda::FusedRecurrentKdaImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // g
                                  .Arg<ffi::AnyBuffer>()  // beta
                                  .Arg<ffi::AnyBuffer>()  // state pool
                                  .Arg<ffi::AnyBuffer>()  // ssm_state_indices
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Arg<ffi::AnyBuffer>()  // A_log
                                  .Arg<ffi::AnyBuffer>()  // dt_bias
                                  .Ret<ffi::AnyBuffer>()  // o
                                  .Ret<ffi::AnyBuffer>()  // state pool
                                  .Attr<float>("scale")
                                  .Attr<bool>("use_qk_l2norm_in_kernel")
                                  .Attr<bool>("use_gate_in_kernel"));
