// Instruction-set selection of every optimized CPU kernel (KDA core, short
// conv, element-wise): the CPU's best variant, overridable through
// SetKernelIsa or the KDA_ISA environment variable, and the dispatch table of
// the chosen one (kernels/isa/dispatch.h). A variant the CPU (or build) lacks
// is a kda::Error, never a SIGILL.
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "base/named_choice.h"
#include "kda/base/error.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/isa/dispatch.h"
#include "kernels/kda/kda_dispatch_testing.h"

namespace kda {
namespace {

// SetKernelIsa's value (never kAuto), else KDA_ISA, parsed once.
EnvSetting<KernelIsa>& Env() {
  static EnvSetting<KernelIsa> env("KDA_ISA", KernelIsa::kAuto);
  return env;
}

// In the enum's order.
constexpr const char* kIsaNames[] = {"auto", "generic", "avx2", "avx512", "avx512_shape"};

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
  return Env().Get([](const char* text) {
    const KernelIsa isa = ParseKernelIsa(text);
    Check(CpuSupportsKernelIsa(isa), [isa] { return Unsupported(isa); });
    return isa;
  });
}

}  // namespace

KernelIsa ParseKernelIsa(const std::string& name) { return ParseNamed<KernelIsa>(name, kIsaNames, "kernel ISA"); }

const char* KernelIsaName(KernelIsa isa) { return NameOf(isa, kIsaNames); }

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
  if (isa == KernelIsa::kAuto) {
    Env().Unset();
  } else {
    Env().Set(isa);
  }
}

KernelIsa ActiveKernelIsa() {
  const KernelIsa isa = EnvKernelIsa();
  return isa == KernelIsa::kAuto ? BestKernelIsa() : isa;
}

namespace internal {

const KernelTable& KernelsFor(KernelIsa isa) {
  if (isa == KernelIsa::kAuto) return ActiveKernels();
  Check(CpuSupportsKernelIsa(isa), [isa] { return Unsupported(isa); });
  return *BuiltTable(isa);
}

const KernelTable& ActiveKernels() { return *BuiltTable(ActiveKernelIsa()); }

void ResetKernelIsaForTesting() { Env().Reset(); }

}  // namespace internal
}  // namespace kda
