// Instruction-set selection of every optimized CPU kernel (KDA core, short
// conv, element-wise): the CPU's best variant, overridable through
// SetKernelIsa or the KDA_ISA environment variable, and the dispatch table of
// the chosen one (kernels/isa/dispatch.h). A variant the CPU (or build) lacks
// is a kda::Error, never a SIGILL.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kda/base/error.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/isa/dispatch.h"
#include "kernels/kda/kda_dispatch_testing.h"

namespace kda {
namespace {

constexpr int kUnset = -1;

// The value given to SetKernelIsa (never kAuto), or kUnset.
std::atomic<int> g_set_isa{kUnset};

// KDA_ISA, parsed once; a bad value is kept as a message and thrown when needed.
struct EnvIsa {
  std::mutex mutex;
  bool parsed = false;
  KernelIsa isa = KernelIsa::kAuto;
  std::string error;
};

EnvIsa& Env() {
  static EnvIsa env;
  return env;
}

// The CPU feature checks, run once (cpuid + the OS's register state for AVX/AVX-512).
struct CpuFeatures {
  bool avx2_target = false;  // AVX2 + FMA + F16C: the AVX2 target's -m flags
  bool avx512f = false;
  CpuFeatures() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    // F16C (fp16 <-> fp32 conversion, the int8 kernels' scales) comes with every AVX2 CPU but is a
    // separate CPUID bit; compilers spell its __builtin_cpu_supports name differently, so CPUID is read.
    unsigned eax = 0;
    unsigned ebx = 0;
    unsigned ecx = 0;
    unsigned edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    avx2_target = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    avx512f = avx2_target && __builtin_cpu_supports("avx512f");
#endif
  }
};

const CpuFeatures& Cpu() {
  static const CpuFeatures cpu;
  return cpu;
}

// The table of a target this build has, else null.
const internal::KernelTable* BuiltTable(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAuto:
    case KernelIsa::kGeneric:
      return &N_GENERIC::Table();
#if defined(KDA_X86_TARGETS)
    case KernelIsa::kAvx2:
      return &N_AVX2::Table();
    case KernelIsa::kAvx512:
      return &N_AVX512::Table();
    case KernelIsa::kAvx512Shape:
      return &N_AVX512_SHAPE::Table();
#else
    case KernelIsa::kAvx2:
    case KernelIsa::kAvx512:
    case KernelIsa::kAvx512Shape:
      return nullptr;
#endif
  }
  return nullptr;
}

// Whether this build has the target's table, decided without touching it: the
// table of a target the CPU lacks must not be reached, since its
// initialisation runs that target's instructions (SIGILL).
bool Built(KernelIsa isa) {
#if defined(KDA_X86_TARGETS)
  static_cast<void>(isa);
  return true;
#else
  return isa == KernelIsa::kAuto || isa == KernelIsa::kGeneric;
#endif
}

std::string Unsupported(KernelIsa isa) {
  const bool built = Built(isa);
  return std::string("kernel ISA '") + KernelIsaName(isa) + "' is not supported by this " + (built ? "CPU" : "build") +
         " (best available: " + KernelIsaName(BestKernelIsa()) + ")";
}

KernelIsa EnvKernelIsa() {
  EnvIsa& env = Env();
  std::lock_guard<std::mutex> lock(env.mutex);
  if (!env.parsed) {
    env.parsed = true;
    env.isa = KernelIsa::kAuto;
    env.error.clear();
    const char* value = std::getenv("KDA_ISA");
    if (value != nullptr && value[0] != '\0') {
      try {
        env.isa = ParseKernelIsa(value);
        Check(CpuSupportsKernelIsa(env.isa), [&env] { return Unsupported(env.isa); });
      } catch (const Error& e) {
        env.error = std::string("KDA_ISA environment variable: ") + e.what();
      }
    }
  }
  if (!env.error.empty()) throw Error(env.error);
  return env.isa;
}

}  // namespace

KernelIsa ParseKernelIsa(const std::string& name) {
  if (name == "auto") return KernelIsa::kAuto;
  if (name == "generic") return KernelIsa::kGeneric;
  if (name == "avx2") return KernelIsa::kAvx2;
  if (name == "avx512") return KernelIsa::kAvx512;
  if (name == "avx512_shape") return KernelIsa::kAvx512Shape;
  throw Error("unknown kernel ISA '" + name + "' (expected auto, generic, avx2, avx512 or avx512_shape)");
}

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAuto:
      return "auto";
    case KernelIsa::kGeneric:
      return "generic";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
    case KernelIsa::kAvx512Shape:
      return "avx512_shape";
  }
  return "?";
}

bool CpuSupportsKernelIsa(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAuto:
    case KernelIsa::kGeneric:
      return true;
    case KernelIsa::kAvx2:
    case KernelIsa::kAvx512Shape:
      return Built(isa) && Cpu().avx2_target;
    case KernelIsa::kAvx512:
      return Built(isa) && Cpu().avx512f;
  }
  return false;
}

KernelIsa BestKernelIsa() {
  if (CpuSupportsKernelIsa(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  if (CpuSupportsKernelIsa(KernelIsa::kAvx2)) return KernelIsa::kAvx2;
  return KernelIsa::kGeneric;
}

void SetKernelIsa(KernelIsa isa) {
  Check(CpuSupportsKernelIsa(isa), [isa] { return Unsupported(isa); });
  g_set_isa.store(isa == KernelIsa::kAuto ? kUnset : static_cast<int>(isa));
}

KernelIsa ActiveKernelIsa() {
  const int set = g_set_isa.load();
  if (set != kUnset) return static_cast<KernelIsa>(set);
  const KernelIsa env = EnvKernelIsa();
  return env == KernelIsa::kAuto ? BestKernelIsa() : env;
}

namespace internal {

const KernelTable& KernelsFor(KernelIsa isa) {
  if (isa == KernelIsa::kAuto) return ActiveKernels();
  Check(CpuSupportsKernelIsa(isa), [isa] { return Unsupported(isa); });
  return *BuiltTable(isa);
}

const KernelTable& ActiveKernels() { return *BuiltTable(ActiveKernelIsa()); }

void ResetKernelIsaForTesting() {
  g_set_isa.store(kUnset);
  EnvIsa& env = Env();
  std::lock_guard<std::mutex> lock(env.mutex);
  env.parsed = false;
}

}  // namespace internal
}  // namespace kda
