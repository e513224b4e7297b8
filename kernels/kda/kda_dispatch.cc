// The KDA kernel dispatcher: which implementation a call runs, and the
// dispatching entry points chunk_kda / fused_recurrent_kda. Auto runs the
// optimized kernels (in the ISA variant of ActiveKernelIsa, kernels/isa/kernel_isa.cc).
#include <string>

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
  const ChunkKdaArgs a = BindChunkKda(call);  // checked there
  if (ResolveKernelImpl(impl) == KernelImpl::kReference) {
    internal::ChunkKdaReferenceUnchecked(a);
  } else {
    internal::ChunkKdaOptimizedUnchecked(a, ActiveKernelIsa());
  }
}

void fused_recurrent_kda(const RecurrentKdaCall& call, KernelImpl impl) {
  const RecurrentKdaArgs a = BindRecurrentKda(call);
  if (ResolveKernelImpl(impl) == KernelImpl::kReference) {
    internal::FusedRecurrentKdaReferenceUnchecked(a);
  } else {
    internal::FusedRecurrentKdaOptimizedUnchecked(a, ActiveKernelIsa());
  }
}

namespace internal {

void ResetDefaultKernelImplForTesting() { Env().Reset(); }

}  // namespace internal

}  // namespace kda
