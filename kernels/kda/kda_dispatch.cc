// The KDA kernel dispatcher: which implementation a call runs, and the
// dispatching entry points chunk_kda / fused_recurrent_kda. Auto runs the
// optimized kernels (in the ISA variant of ActiveKernelIsa, kernels/isa/kernel_isa.cc).
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "base/named_choice.h"
#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/kda/kda_common.h"
#include "kernels/kda/kda_dispatch_testing.h"
#include "kernels/kda/kda_tasks.h"

namespace kda {
namespace {

// SetDefaultKernelImpl's value, else KDA_KERNEL, parsed once.
EnvSetting<KernelImpl>& Env() {
  static EnvSetting<KernelImpl> env("KDA_KERNEL", KernelImpl::kAuto);
  return env;
}

KernelImpl EnvKernelImpl() {
  return Env().Get([](const char* text) { return ParseKernelImpl(text); });
}

// In the enum's order.
constexpr const char* kImplNames[] = {"auto", "reference", "optimized"};

// Checked arguments (bound, or trusted) on the kernels of `impl` (resolved).
void Run(const ChunkKdaArgs& a, KernelImpl impl) {
  if (impl == KernelImpl::kReference) {
    internal::ChunkKdaReferenceUnchecked(a);
  } else {
    internal::ChunkKdaOptimizedUnchecked(a, ActiveKernelIsa());
  }
}
void Run(const RecurrentKdaArgs& a, KernelImpl impl) {
  if (impl == KernelImpl::kReference) {
    internal::FusedRecurrentKdaReferenceUnchecked(a);
  } else {
    internal::FusedRecurrentKdaOptimizedUnchecked(a, ActiveKernelIsa());
  }
}

// A call in several dtypes (NeedsFloat32Copies) on fp32 copies: what fla computes (each tensor read in its
// own dtype, fp32 math). The copies are C-contiguous (a token-strided q, k or v read by its strides); the
// outputs in another dtype than fp32 (o, fla's h, a float16 / bfloat16 pool written in place) get fp32
// buffers, rounded into the caller's once the kernel has returned: a refused call writes nothing.
class Float32Copies {
 public:
  // The fp32 copy of `v` (a view of it: same shape, C-contiguous); `v` itself when it is fp32 and contiguous.
  template <class View>
  View Widen(const View& v) {
    if (!v.present() || (v.dtype == DType::kF32 && !v.strided)) return v;
    std::vector<float>& buf = buffers_.emplace_back(static_cast<size_t>(v.numel()));
    int64_t index[kMaxViewDims] = {};
    int64_t contiguous[kMaxViewDims] = {};
    for (int d = v.ndim, step = 1; d-- > 0;) {
      contiguous[d] = step;
      step *= static_cast<int>(v.shape[d]);
    }
    for (size_t i = 0; i < buf.size(); ++i) {
      int64_t at = 0;
      for (int d = 0; d < v.ndim; ++d) at += index[d] * (v.strided ? v.strides[d] : contiguous[d]);
      buf[i] = LoadAsFloat(v.data, v.dtype, static_cast<size_t>(at));
      for (int d = v.ndim; d-- > 0;) {
        if (++index[d] < v.shape[d]) break;
        index[d] = 0;
      }
    }
    View w = v;
    w.data = buf.data();
    w.dtype = DType::kF32;
    w.strided = false;
    return w;
  }
  // An fp32 buffer for the output `v` (its values copied in when `read`: a state updated in place), rounded
  // into `v` by Finish.
  MutTensorView Output(const MutTensorView& v, bool read) {
    if (!v.present() || v.dtype == DType::kF32) return v;
    MutTensorView w = read ? Widen(v) : v;
    if (!read) {
      w.data = buffers_.emplace_back(static_cast<size_t>(v.numel())).data();
      w.dtype = DType::kF32;
      w.strided = false;
    }
    outputs_.emplace_back(v, static_cast<const float*>(w.data));
    return w;
  }
  // Rounds each fp32 output into the caller's buffer (to nearest even).
  void Finish() const {
    for (const auto& [to, from] : outputs_) {
      const int64_t n = to.numel();
      for (int64_t i = 0; i < n; ++i) StoreFromFloat(to.data, to.dtype, static_cast<size_t>(i), from[i]);
    }
  }

 private:
  std::deque<std::vector<float>> buffers_;  // stable addresses
  std::vector<std::pair<MutTensorView, const float*>> outputs_;
};

// The tokens of a call on fp32 copies when their dtypes differ, o then an fp32 buffer too; whether they did.
template <class Call>
bool WidenTokens(Call& c, Float32Copies& copies) {
  if (c.k.dtype == c.q.dtype && c.v.dtype == c.q.dtype) return false;
  c.q = copies.Widen(c.q);
  c.k = copies.Widen(c.k);
  c.v = copies.Widen(c.v);
  c.o = copies.Output(c.o, /*read=*/false);
  return true;
}

}  // namespace

KernelImpl ParseKernelImpl(const std::string& name) { return ParseNamed<KernelImpl>(name, kImplNames, "kernel"); }

const char* KernelImplName(KernelImpl impl) { return NameOf(impl, kImplNames); }

void SetDefaultKernelImpl(KernelImpl impl) { Env().Set(impl); }

KernelImpl DefaultKernelImpl() { return EnvKernelImpl(); }

KernelImpl ResolveKernelImpl(KernelImpl requested) {
  const KernelImpl impl = requested == KernelImpl::kAuto ? DefaultKernelImpl() : requested;
  switch (impl) {
    case KernelImpl::kReference:
      return KernelImpl::kReference;
    case KernelImpl::kAuto:  // the optimized kernels cover every valid shape and CPU (generic variant)
    case KernelImpl::kOptimized:
      ActiveKernelIsa();  // a bad KDA_ISA is refused here, before any work
      return KernelImpl::kOptimized;
  }
  throw Error("unknown kernel implementation");
}

const char* ActiveKernelDescription(KernelImpl requested) {
  if (ResolveKernelImpl(requested) == KernelImpl::kReference) return "reference";
  switch (ActiveKernelIsa()) {
    case KernelIsa::kAvx512:
      return "optimized/avx512";
    case KernelIsa::kAvx2:
      return "optimized/avx2";
    case KernelIsa::kAvx512Shape:
      return "optimized/avx512_shape";
    case KernelIsa::kAuto:
    case KernelIsa::kGeneric:
      break;
  }
  return "optimized/generic";
}

void chunk_kda(const ChunkKdaCall& call, KernelImpl impl) {
  if (NeedsFloat32Copies(call)) {
    CheckCallToCopy(call);  // the call as given, before any copy
    Float32Copies copies;
    ChunkKdaCall c = call;
    // fla's h is in k's dtype: fp32 with the fp32 tokens.
    if (WidenTokens(c, copies)) c.intermediate_states = copies.Output(call.intermediate_states, /*read=*/false);
    c.initial_state = copies.Widen(call.initial_state);
    chunk_kda(c, impl);
    copies.Finish();
    return;
  }
  Run(BindChunkKda(call), ResolveKernelImpl(impl));  // checked by the bind
}

void fused_recurrent_kda(const RecurrentKdaCall& call, KernelImpl impl) {
  if (NeedsFloat32Copies(call)) {
    CheckCallToCopy(call);  // the call as given, before any copy
    Float32Copies copies;
    RecurrentKdaCall c = call;
    WidenTokens(c, copies);
    // The pool (or [N, HV, K, V]) read, and written back with inplace_final_state.
    c.initial_state =
        call.inplace_final_state ? copies.Output(call.initial_state, /*read=*/true) : copies.Widen(call.initial_state);
    fused_recurrent_kda(c, impl);
    copies.Finish();
    return;
  }
  Run(BindRecurrentKda(call), ResolveKernelImpl(impl));  // checked by the bind
}

void RunTrusted(const ChunkKdaArgs& a, KernelImpl impl) {
#ifdef KDA_VALIDATE_TRUSTED_CALLS
  ValidateChunkKda(a);
#endif
  Run(a, impl);
}

void RunTrusted(const RecurrentKdaArgs& a, KernelImpl impl) {
#ifdef KDA_VALIDATE_TRUSTED_CALLS
  ValidateRecurrentKda(a);
#endif
  Run(a, impl);
}

namespace internal {

void ResetDefaultKernelImplForTesting() { Env().Reset(); }

}  // namespace internal

}  // namespace kda
