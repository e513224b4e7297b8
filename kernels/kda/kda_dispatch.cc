// The KDA kernel dispatcher: which implementation a call runs, and the
// dispatching entry points chunk_kda / fused_recurrent_kda. Auto runs the
// optimized kernels (in the ISA variant of ActiveKernelIsa, kernels/isa/kernel_isa.cc).
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kda/base/error.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/kda/kda_common.h"
#include "kernels/kda/kda_dispatch_testing.h"
#include "kernels/kda/kda_tasks.h"

namespace kda {
namespace {

constexpr int kUnset = -1;

// The value given to SetDefaultKernelImpl, or kUnset.
std::atomic<int> g_set_default{kUnset};

// KDA_KERNEL, parsed once. A bad value is kept as an error message and thrown
// whenever the default is needed (an Error, never an abort at startup).
struct EnvDefault {
  std::mutex mutex;
  bool parsed = false;
  KernelImpl impl = KernelImpl::kAuto;
  std::string error;
};

EnvDefault& Env() {
  static EnvDefault env;
  return env;
}

KernelImpl EnvKernelImpl() {
  EnvDefault& env = Env();
  std::lock_guard<std::mutex> lock(env.mutex);
  if (!env.parsed) {
    env.parsed = true;
    env.impl = KernelImpl::kAuto;
    env.error.clear();
    const char* value = std::getenv("KDA_KERNEL");
    if (value != nullptr && value[0] != '\0') {
      try {
        env.impl = ParseKernelImpl(value);
      } catch (const Error& e) {
        env.error = std::string("KDA_KERNEL environment variable: ") + e.what();
      }
    }
  }
  if (!env.error.empty()) throw Error(env.error);
  return env.impl;
}

}  // namespace

KernelImpl ParseKernelImpl(const std::string& name) {
  if (name == "auto") return KernelImpl::kAuto;
  if (name == "reference") return KernelImpl::kReference;
  if (name == "optimized") return KernelImpl::kOptimized;
  throw Error("unknown kernel '" + name + "' (expected auto, reference or optimized)");
}

const char* KernelImplName(KernelImpl impl) {
  switch (impl) {
    case KernelImpl::kAuto:
      return "auto";
    case KernelImpl::kReference:
      return "reference";
    case KernelImpl::kOptimized:
      return "optimized";
  }
  return "?";
}

void SetDefaultKernelImpl(KernelImpl impl) { g_set_default.store(static_cast<int>(impl)); }

KernelImpl DefaultKernelImpl() {
  const int set = g_set_default.load();
  if (set != kUnset) return static_cast<KernelImpl>(set);
  return EnvKernelImpl();
}

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

void chunk_kda(const ChunkKdaArgs& a, KernelImpl impl) {
  ValidateChunkKda(a);
  if (ResolveKernelImpl(impl) == KernelImpl::kReference) {
    internal::ChunkKdaReferenceUnchecked(a);
  } else {
    internal::ChunkKdaOptimizedUnchecked(a, ActiveKernelIsa());
  }
}

void fused_recurrent_kda(const RecurrentKdaArgs& a, KernelImpl impl) {
  ValidateRecurrentKda(a);
  if (ResolveKernelImpl(impl) == KernelImpl::kReference) {
    internal::FusedRecurrentKdaReferenceUnchecked(a);
  } else {
    internal::FusedRecurrentKdaOptimizedUnchecked(a, ActiveKernelIsa());
  }
}

namespace internal {

void ResetDefaultKernelImplForTesting() {
  g_set_default.store(kUnset);
  EnvDefault& env = Env();
  std::lock_guard<std::mutex> lock(env.mutex);
  env.parsed = false;
}

}  // namespace internal

}  // namespace kda
