// The GEMM route (kda/kernels/gemm_route.h): the table of measured CPUs, the
// CPU's identity, and the one switch (SetGemmRoute / KDA_GEMM_ROUTE / table).
#include "kda/kernels/gemm_route.h"

#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "base/named_choice.h"
#include "kda/base/error.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/gemm/gemm_internal.h"

namespace kda {
namespace {

// In the enum's order.
constexpr const char* kRouteNames[] = {"auto", "bf16_dot", "fp32_fma"};

// Register-only rates of one core (`kda bench-kernels --json`: fma_peak_gflops
// and bf16_dot_gflops over its threads), fp32 FMA counted as 2 flops per lane
// and vdpbf16ps as 4. The bf16 dot is the route where it is the faster.
struct MeasuredCpu {
  const char* vendor;
  unsigned family;
  unsigned model;
  const char* name;
  double fma_gflops;
  double bf16_dot_gflops;
};

constexpr MeasuredCpu kMeasuredCpus[] = {
    // Zen 4 runs a 512-bit FMA as two halves; its bf16 dot is the fast route.
    {"AuthenticAMD", 25, 17, "Zen 4", 116.0, 230.0},
    // vdpbf16ps issues at half the FMA rate here.
    {"GenuineIntel", 6, 207, "Xeon, Emerald Rapids", 167.0, 82.0},
};

struct CpuIdentity {
  char vendor[13] = {};
  unsigned family = 0;
  unsigned model = 0;
  bool avx512_bf16 = false;
  CpuIdentity() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned eax = 0;
    unsigned ebx = 0;
    unsigned ecx = 0;
    unsigned edx = 0;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) != 0) {
      std::memcpy(vendor, &ebx, 4);
      std::memcpy(vendor + 4, &edx, 4);
      std::memcpy(vendor + 8, &ecx, 4);
    }
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0) {
      // The displayed family and model (Intel SDM / AMD APM): the extended
      // fields add in where the base family is 15 (and 6, for the model).
      const unsigned base_family = (eax >> 8) & 0xfU;
      const unsigned base_model = (eax >> 4) & 0xfU;
      family = base_family == 0xfU ? base_family + ((eax >> 20) & 0xffU) : base_family;
      model = base_family == 0xfU || base_family == 6U ? base_model + (((eax >> 16) & 0xfU) << 4) : base_model;
    }
    __builtin_cpu_init();
    avx512_bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#endif
  }
  const MeasuredCpu* Measured() const {
    for (const MeasuredCpu& c : kMeasuredCpus) {
      if (std::strcmp(c.vendor, vendor) == 0 && c.family == family && c.model == model) return &c;
    }
    return nullptr;
  }
};

const CpuIdentity& Cpu() {
  static const CpuIdentity cpu;
  return cpu;
}

// The table's route for this CPU, whether or not it can run now; a CPU not in
// the table takes the bf16 dot where it has the instruction.
GemmRoute TableRoute() {
  const MeasuredCpu* m = Cpu().Measured();
  if (m != nullptr) return m->bf16_dot_gflops > m->fma_gflops ? GemmRoute::kBf16Dot : GemmRoute::kF32Fma;
  return Cpu().avx512_bf16 ? GemmRoute::kBf16Dot : GemmRoute::kF32Fma;
}

EnvSetting<GemmRoute>& Env() {
  static EnvSetting<GemmRoute> env("KDA_GEMM_ROUTE", GemmRoute::kAuto);
  return env;
}

std::string Unsupported(GemmRoute route) {
  return std::string("GEMM route '") + GemmRouteName(route) + "' cannot run here (" +
         (Cpu().avx512_bf16
              ? "the bf16 dot needs the avx512 kernels; KDA_ISA is " + std::string(KernelIsaName(ActiveKernelIsa()))
              : std::string("the CPU has no AVX512-BF16")) +
         ")";
}

}  // namespace

GemmRoute ParseGemmRoute(const std::string& name) { return ParseNamed<GemmRoute>(name, kRouteNames, "GEMM route"); }

const char* GemmRouteName(GemmRoute route) { return NameOf(route, kRouteNames); }

bool CpuSupportsGemmRoute(GemmRoute route) {
  switch (route) {
    case GemmRoute::kAuto:
    case GemmRoute::kF32Fma:
      return true;
    case GemmRoute::kBf16Dot:
      return Cpu().avx512_bf16 && ActiveKernelIsa() == KernelIsa::kAvx512;
  }
  return false;
}

void SetGemmRoute(GemmRoute route) {
  Check(CpuSupportsGemmRoute(route), [route] { return Unsupported(route); });
  if (route == GemmRoute::kAuto) {
    Env().Unset();
  } else {
    Env().Set(route);
  }
}

GemmRoute ActiveGemmRoute() {
  const GemmRoute chosen = Env().Get([](const char* text) { return ParseGemmRoute(text); });
  if (chosen != GemmRoute::kAuto) {
    // Checked on every use: KDA_ISA may change what can run.
    Check(CpuSupportsGemmRoute(chosen), [chosen] { return Unsupported(chosen); });
    return chosen;
  }
  const GemmRoute table = TableRoute();
  return CpuSupportsGemmRoute(table) ? table : GemmRoute::kF32Fma;
}

std::string ActiveGemmRouteDescription() {
  const GemmRoute route = ActiveGemmRoute();
  const CpuIdentity& cpu = Cpu();
  char id[96];
  std::snprintf(id, sizeof(id), "%s family %u model %u", cpu.vendor, cpu.family, cpu.model);
  std::string why;
  if (Env().Get([](const char* text) { return ParseGemmRoute(text); }) != GemmRoute::kAuto) {
    why = "forced (SetGemmRoute or KDA_GEMM_ROUTE)";
  } else if (route != TableRoute()) {
    why = Unsupported(TableRoute());
  } else if (const MeasuredCpu* m = cpu.Measured()) {
    char rates[160];
    std::snprintf(rates, sizeof(rates), "%s, %s: bf16 dot %.0f vs fp32 FMA %.0f GFLOP/s per core", id, m->name,
                  m->bf16_dot_gflops, m->fma_gflops);
    why = rates;
  } else {
    why = std::string(id) + ": not in the table of measured CPUs; " +
          (cpu.avx512_bf16 ? "the bf16 dot where the CPU has AVX512-BF16" : "no AVX512-BF16");
  }
  return std::string(GemmRouteName(route)) + " (" + why + ")";
}

namespace internal {

void ResetGemmRouteForTesting() { Env().Reset(); }

}  // namespace internal
}  // namespace kda
