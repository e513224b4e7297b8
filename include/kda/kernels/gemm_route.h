// How the projections (kda/kernels/linear.h) multiply bf16 values: the GEMM
// route, chosen once per process from the CPU's identity and a table of
// measured rates (kernels/gemm/gemm_route.cc), overridable through
// SetGemmRoute or the KDA_GEMM_ROUTE environment variable. KDA_ISA limits
// which routes exist: the bf16 dot is an AVX-512 instruction.
//
// Both routes compute the same products: a bf16 x bf16 product is exact in
// fp32, so they differ only in the order of the fp32 sums (and the bf16 dot's
// flush of subnormal fp32 values). The fp32 pipeline always uses fp32 FMAs.
#pragma once

#include <cstdint>
#include <string>

namespace kda {

enum class GemmRoute : uint8_t {
  kAuto,     // the table's choice for this CPU
  kBf16Dot,  // bf16 inputs and weights through vdpbf16ps (AVX512-BF16)
  kF32Fma,   // bf16 inputs and weights widened to fp32 (exact), fp32 FMAs
};

// "auto" | "bf16_dot" | "fp32_fma"; throws kda::Error on anything else.
GemmRoute ParseGemmRoute(const std::string& name);
const char* GemmRouteName(GemmRoute route);

// Whether the route can run here: kBf16Dot needs an AVX512-BF16 CPU and the
// avx512 kernels (ActiveKernelIsa()); kF32Fma and kAuto always can.
bool CpuSupportsGemmRoute(GemmRoute route);

// Forces the route (kAuto: back to KDA_GEMM_ROUTE, else the table). Throws
// kda::Error if the route cannot run here.
void SetGemmRoute(GemmRoute route);
// The route the projections use now (never kAuto): SetGemmRoute's, else
// KDA_GEMM_ROUTE's (auto|bf16_dot|fp32_fma), else the table's where it can
// run, else kF32Fma. Throws kda::Error if KDA_GEMM_ROUTE is unknown or names
// a route that cannot run here.
GemmRoute ActiveGemmRoute();
// The active route and why, for a run's log line, e.g. "bf16_dot (AMD family
// 25 model 17, Zen 4: bf16 dot 230 vs fp32 FMA 116 GFLOP/s per core)".
std::string ActiveGemmRouteDescription();

}  // namespace kda
