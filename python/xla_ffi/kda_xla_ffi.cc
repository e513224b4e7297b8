// XLA FFI handlers of the KDA kernels for JAX on the CPU platform (kda.jax):
// the typed FFI calls into kda::chunk_kda / kda::fused_recurrent_kda (the
// dispatcher: optimized kernels unless KDA_KERNEL says otherwise) on the
// buffers XLA hands over. Python registers the two symbols with
// jax.ffi.register_ffi_target (python/kda/jax/ffi.py), which also checks the
// shapes first; the checks here repeat them so that a direct call cannot read
// out of bounds.
//
// Targets (inputs in this order, results; attributes scale: f32, flags: pred;
// q, k, g [B,T,H,K], v [B,T,H,V], beta [B,T,H], q/k/v one of f32/bf16):
//   KdaChunkKda(q, k, v, g, beta, cu_seqlens [N+1] s32, state f32,
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
// Python side casts int64 inputs); the kernels' int64 cu_seqlens are built
// here.
#include <cstdint>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

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

// The kda dtype of a float buffer, or an error naming the operand.
ffi::Error FloatDType(const ffi::AnyBuffer& b, const char* who, const char* name, DType* out) {
  switch (b.element_type()) {
    case ffi::DataType::F32:
      *out = DType::kF32;
      return ffi::Error::Success();
    case ffi::DataType::BF16:
      *out = DType::kBF16;
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(std::string(who) + ": " + name + " must be float32 or bfloat16");
  }
}

std::string DimsString(ffi::AnyBuffer::Dimensions d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Error unless `d` equals `want`.
ffi::Error CheckDims(ffi::AnyBuffer::Dimensions d, const std::vector<int64_t>& want, const char* who,
                     const char* name) {
  bool ok = d.size() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = d[i] == want[i];
  if (ok) return ffi::Error::Success();
  std::string w = "[";
  for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
  return ffi::Error::InvalidArgument(std::string(who) + ": " + name + " must have shape " + w + "], got " +
                                     DimsString(d));
}

// The head shape and the token operands shared by both targets.
struct TokenOperands {
  int64_t B = 0, T = 0;
  int H = 0, K = 0, V = 0;
  DType q_dtype = DType::kF32, g_dtype = DType::kF32, beta_dtype = DType::kF32;
};

ffi::Error CheckTokens(const char* who, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                       const ffi::AnyBuffer& g, const ffi::AnyBuffer& beta, const ffi::AnyBuffer& o,
                       TokenOperands* out) {
  TokenOperands& t = *out;
  const auto qd = q.dimensions();
  if (qd.size() != 4) return ffi::Error::InvalidArgument(std::string(who) + ": q must be [B, T, H, K]");
  if (v.dimensions().size() != 4) return ffi::Error::InvalidArgument(std::string(who) + ": v must be [B, T, H, V]");
  t.B = qd[0];
  t.T = qd[1];
  t.H = static_cast<int>(qd[2]);
  t.K = static_cast<int>(qd[3]);
  t.V = static_cast<int>(v.dimensions()[3]);
  const std::vector<int64_t> bthk = {t.B, t.T, t.H, t.K};
  const std::vector<int64_t> bthv = {t.B, t.T, t.H, t.V};
  for (const auto& [buf, name, want] : {std::tuple{&k, "k", &bthk}, std::tuple{&v, "v", &bthv},
                                        std::tuple{&g, "g", &bthk}, std::tuple{&o, "o", &bthv}}) {
    if (ffi::Error e = CheckDims(buf->dimensions(), *want, who, name); e.failure()) return e;
  }
  if (ffi::Error e = CheckDims(beta.dimensions(), {t.B, t.T, t.H}, who, "beta"); e.failure()) return e;
  if (ffi::Error e = FloatDType(q, who, "q", &t.q_dtype); e.failure()) return e;
  if (ffi::Error e = FloatDType(g, who, "g", &t.g_dtype); e.failure()) return e;
  if (ffi::Error e = FloatDType(beta, who, "beta", &t.beta_dtype); e.failure()) return e;
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type() ||
      o.element_type() != q.element_type()) {
    return ffi::Error::InvalidArgument(std::string(who) + ": k, v and o must have q's dtype");
  }
  return ffi::Error::Success();
}

// Gate options from the optional A_log [H] / dt_bias [H*K] buffers ([0]: absent).
ffi::Error Options(const char* who, const TokenOperands& t, float scale, bool l2norm, bool gate,
                   const ffi::Buffer<ffi::F32>& a_log, const ffi::Buffer<ffi::F32>& dt_bias, KdaOptions* out) {
  KdaOptions& opt = *out;
  opt.scale = scale;
  opt.use_qk_l2norm_in_kernel = l2norm;
  opt.use_gate_in_kernel = gate;
  if (gate) {
    if (a_log.element_count() != static_cast<size_t>(t.H)) {
      return ffi::Error::InvalidArgument(
          std::string(who) + ": use_gate_in_kernel needs A_log with H = " + std::to_string(t.H) + " elements");
    }
    opt.A_log = a_log.typed_data();
    if (dt_bias.element_count() != 0) {
      if (dt_bias.element_count() != static_cast<size_t>(t.H) * static_cast<size_t>(t.K)) {
        return ffi::Error::InvalidArgument(std::string(who) + ": dt_bias must have H*K elements");
      }
      opt.dt_bias = dt_bias.typed_data();
    }
  }
  return ffi::Error::Success();
}

// Runs a kernel call, turning the kernels' kda::Error into an InvalidArgument
// (bad values seen only at run time: cu_seqlens, state indices).
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

ffi::Error ChunkKdaImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g, ffi::AnyBuffer beta,
                        ffi::Buffer<ffi::S32> cu_seqlens, ffi::Buffer<ffi::F32> state,
                        ffi::Buffer<ffi::S32> state_indices, ffi::Buffer<ffi::F32> a_log, ffi::Buffer<ffi::F32> dt_bias,
                        ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> final_state, float scale,
                        bool use_qk_l2norm_in_kernel, bool use_gate_in_kernel, bool output_final_state, bool pool) {
  static const char* const kWho = "chunk_kda";
  TokenOperands t;
  if (ffi::Error e = CheckTokens(kWho, q, k, v, g, beta, *o, &t); e.failure()) return e;
  KdaOptions opt;
  if (ffi::Error e = Options(kWho, t, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, a_log, dt_bias, &opt);
      e.failure()) {
    return e;
  }
  if (cu_seqlens.dimensions().size() != 1 || cu_seqlens.element_count() < 2) {
    return ffi::Error::InvalidArgument("chunk_kda: cu_seqlens must be [N + 1] with N >= 1");
  }
  const int64_t n_seq = static_cast<int64_t>(cu_seqlens.element_count()) - 1;
  // The kernels take int64 boundaries; N + 1 values, kept per thread.
  thread_local std::vector<int64_t> cu;
  cu.assign(cu_seqlens.typed_data(), cu_seqlens.typed_data() + n_seq + 1);

  ChunkKdaArgs a;
  a.o = {o->untyped_data(), t.q_dtype};
  a.q = {q.untyped_data(), t.q_dtype};
  a.k = {k.untyped_data(), t.q_dtype};
  a.v = {v.untyped_data(), t.q_dtype};
  a.g = {g.untyped_data(), t.g_dtype};
  a.beta = {beta.untyped_data(), t.beta_dtype};
  a.cu_seqlens = cu.data();
  a.T = t.B * t.T;
  a.N = n_seq;
  a.H = t.H;
  a.K = t.K;
  a.V = t.V;
  a.options = opt;
  const std::vector<int64_t> nhkv = {n_seq, t.H, t.K, t.V};
  if (pool) {
    const auto sd = final_state->dimensions();
    if (sd.size() != 4 || sd[1] != t.H || sd[2] != t.K || sd[3] != t.V) {
      return ffi::Error::InvalidArgument("chunk_kda: the state pool must be [S, H, K, V], got " + DimsString(sd));
    }
    if (ffi::Error e = CheckDims(state_indices.dimensions(), {n_seq}, kWho, "state_indices"); e.failure()) return e;
    // The pool is read and written through the aliased result.
    a.state = final_state->typed_data();
    a.state_indices = state_indices.typed_data();
    a.num_states = sd[0];
    a.output_final_state = true;
  } else {
    if (state.element_count() != 0) {
      if (ffi::Error e = CheckDims(state.dimensions(), nhkv, kWho, "initial_state"); e.failure()) return e;
      a.initial_state = state.typed_data();
    }
    a.output_final_state = output_final_state;
    if (output_final_state) {
      if (ffi::Error e = CheckDims(final_state->dimensions(), nhkv, kWho, "final_state"); e.failure()) return e;
      a.final_state = final_state->typed_data();
    }
  }
  return Run([&] { chunk_kda(a); });
}

ffi::Error FusedRecurrentKdaImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer g,
                                 ffi::AnyBuffer beta, ffi::Buffer<ffi::F32> /*state: aliased to state_out*/,
                                 ffi::Buffer<ffi::S32> state_indices, ffi::Buffer<ffi::S32> cu_seqlens,
                                 ffi::Buffer<ffi::F32> a_log, ffi::Buffer<ffi::F32> dt_bias,
                                 ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> state_out,
                                 float scale, bool use_qk_l2norm_in_kernel, bool use_gate_in_kernel) {
  static const char* const kWho = "fused_recurrent_kda";
  TokenOperands t;
  if (ffi::Error e = CheckTokens(kWho, q, k, v, g, beta, *o, &t); e.failure()) return e;
  KdaOptions opt;
  if (ffi::Error e = Options(kWho, t, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, a_log, dt_bias, &opt);
      e.failure()) {
    return e;
  }
  const int64_t n = t.B * t.T;  // one token per sequence
  if (ffi::Error e = CheckDims(state_indices.dimensions(), {n}, kWho, "ssm_state_indices"); e.failure()) return e;
  if (cu_seqlens.element_count() != 0) {
    if (ffi::Error e = CheckDims(cu_seqlens.dimensions(), {n + 1}, kWho, "cu_seqlens"); e.failure()) return e;
    const int32_t* cu = cu_seqlens.typed_data();
    for (int64_t i = 0; i <= n; ++i) {
      if (cu[i] != i) {
        return ffi::Error::InvalidArgument("fused_recurrent_kda: decode takes one token per sequence, but cu_seqlens[" +
                                           std::to_string(i) + "] = " + std::to_string(cu[i]) + " (want " +
                                           std::to_string(i) + ")");
      }
    }
  }
  const auto sd = state_out->dimensions();
  if (sd.size() != 4 || sd[1] != t.H || sd[2] != t.K || sd[3] != t.V) {
    return ffi::Error::InvalidArgument("fused_recurrent_kda: the state pool must be [S, H, K, V], got " +
                                       DimsString(sd));
  }
  RecurrentKdaArgs a;
  a.o = {o->untyped_data(), t.q_dtype};
  a.state = state_out->typed_data();  // the pool, aliased to the input
  a.state_indices = state_indices.typed_data();
  a.num_states = sd[0];
  a.q = {q.untyped_data(), t.q_dtype};
  a.k = {k.untyped_data(), t.q_dtype};
  a.v = {v.untyped_data(), t.q_dtype};
  a.g = {g.untyped_data(), t.g_dtype};
  a.beta = {beta.untyped_data(), t.beta_dtype};
  a.N = n;
  a.H = t.H;
  a.K = t.K;
  a.V = t.V;
  a.options = opt;
  return Run([&] { fused_recurrent_kda(a); });
}

}  // namespace
}  // namespace kda

XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaChunkKda, kda::ChunkKdaImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // q
                                  .Arg<ffi::AnyBuffer>()         // k
                                  .Arg<ffi::AnyBuffer>()         // v
                                  .Arg<ffi::AnyBuffer>()         // g
                                  .Arg<ffi::AnyBuffer>()         // beta
                                  .Arg<ffi::Buffer<ffi::S32>>()  // cu_seqlens
                                  .Arg<ffi::Buffer<ffi::F32>>()  // initial state or pool
                                  .Arg<ffi::Buffer<ffi::S32>>()  // state_indices
                                  .Arg<ffi::Buffer<ffi::F32>>()  // A_log
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dt_bias
                                  .Ret<ffi::AnyBuffer>()         // o
                                  .Ret<ffi::Buffer<ffi::F32>>()  // final state or pool
                                  .Attr<float>("scale")
                                  .Attr<bool>("use_qk_l2norm_in_kernel")
                                  .Attr<bool>("use_gate_in_kernel")
                                  .Attr<bool>("output_final_state")
                                  .Attr<bool>("pool"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KdaFusedRecurrentKda, kda::FusedRecurrentKdaImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // q
                                  .Arg<ffi::AnyBuffer>()         // k
                                  .Arg<ffi::AnyBuffer>()         // v
                                  .Arg<ffi::AnyBuffer>()         // g
                                  .Arg<ffi::AnyBuffer>()         // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state pool
                                  .Arg<ffi::Buffer<ffi::S32>>()  // ssm_state_indices
                                  .Arg<ffi::Buffer<ffi::S32>>()  // cu_seqlens
                                  .Arg<ffi::Buffer<ffi::F32>>()  // A_log
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dt_bias
                                  .Ret<ffi::AnyBuffer>()         // o
                                  .Ret<ffi::Buffer<ffi::F32>>()  // state pool
                                  .Attr<float>("scale")
                                  .Attr<bool>("use_qk_l2norm_in_kernel")
                                  .Attr<bool>("use_gate_in_kernel"));
