// How the projections (kda/kernels/linear.h) multiply bf16 values: the GEMM
// route, one per class of row counts (decode steps, verify and small batches,
// prefill), chosen once per process from what the process can really run
// (kernels/gemm/gemm_route.cc): the tile unit where the OS grants its state
// and oneDNN dispatches to it, else the faster of the bf16 dot and fp32 FMAs
// by a register-only probe of both at start-up. SetGemmRoute / SetGemmPlan or
// the KDA_GEMM_ROUTE environment variable force routes; KDA_ISA limits which
// exist (the bf16 dot and the tiles need the avx512 kernels).
//
// Every route computes the same products: a bf16 x bf16 product is exact in
// fp32, so they differ only in the order of the fp32 sums (and the bf16 dot's
// and the tiles' flush of subnormal fp32 values). The fp32 pipeline always
// uses fp32 FMAs.
#pragma once

#include <cstdint>
#include <string>

#include "kda/base/dtype.h"

namespace kda {

enum class GemmRoute : uint8_t {
  kAuto,     // the start-up choice for this process
  kBf16Dot,  // bf16 inputs and weights through vdpbf16ps (AVX512-BF16)
  kF32Fma,   // bf16 inputs and weights widened to fp32 (exact), fp32 FMAs
  kAmx,      // bf16 tiles (AMX-BF16, tdpbf16ps) through oneDNN's brgemm, fp32 sums
};

// The classes of row counts M a projection is called with, each with its route.
enum class GemmRows : uint8_t {
  kDecode,   // M <= kGemmDecodeMaxRows: decode batches (kda's small-M kernels, or tiles)
  kBatch,    // up to kGemmBatchMaxRows: speculative verify, chunked-prefill tails, large decode batches
  kPrefill,  // more rows
};
inline constexpr int64_t kGemmDecodeMaxRows = 16;
inline constexpr int64_t kGemmBatchMaxRows = 256;
inline constexpr int kGemmRowClasses = 3;
GemmRows GemmRowsOf(int64_t m);
const char* GemmRowsName(GemmRows rows);  // "decode" | "batch" | "prefill"

// One route per class of rows (kAuto: the start-up choice).
struct GemmPlan {
  GemmRoute decode = GemmRoute::kAuto;
  GemmRoute batch = GemmRoute::kAuto;
  GemmRoute prefill = GemmRoute::kAuto;
  GemmRoute For(GemmRows rows) const;
  GemmRoute ForRows(int64_t m) const { return For(GemmRowsOf(m)); }
  GemmRoute& At(GemmRows rows);
  bool operator==(const GemmPlan&) const = default;
  static GemmPlan All(GemmRoute route) { return {route, route, route}; }
};

// "auto" | "bf16_dot" | "fp32_fma" | "amx"; throws kda::Error on anything else.
GemmRoute ParseGemmRoute(const std::string& name);
const char* GemmRouteName(GemmRoute route);
// One route for every class ("amx"), or classes by name
// ("decode=bf16_dot,batch=amx,prefill=amx"; a class not named: auto).
// Throws kda::Error naming the bad part.
GemmPlan ParseGemmPlan(const std::string& text);
// "decode=fp32_fma,batch=amx,prefill=amx" (ParseGemmPlan reads it back).
std::string GemmPlanName(const GemmPlan& plan);

// Whether the route can run here: kBf16Dot needs an AVX512-BF16 CPU, kAmx
// AMX-BF16 with the tile state granted by the OS and oneDNN dispatching its
// bf16 matmul to the tiles; both the avx512 kernels (ActiveKernelIsa()).
// kF32Fma and kAuto always can.
bool CpuSupportsGemmRoute(GemmRoute route);

// Forces one route for every class (kAuto: back to KDA_GEMM_ROUTE, else the
// start-up choice). Throws kda::Error if the route cannot run here.
void SetGemmRoute(GemmRoute route);
// Forces a route per class (kAuto entries: the start-up choice; all kAuto:
// back to KDA_GEMM_ROUTE). Throws kda::Error if a route cannot run here.
void SetGemmPlan(const GemmPlan& plan);
// The routes the projections use now, never kAuto: SetGemmPlan's, else
// KDA_GEMM_ROUTE's, else the start-up choice where it can run, else kF32Fma.
// Throws kda::Error if KDA_GEMM_ROUTE is bad or names a route that cannot run
// here.
GemmPlan ActiveGemmPlan();
// The route for M rows (ActiveGemmPlan().ForRows(m)).
GemmRoute ActiveGemmRoute(int64_t m);
// The routes a pipeline multiplies with: ActiveGemmPlan() for bf16
// activations, fp32_fma for every class of the fp32 pipeline.
GemmPlan PipelineGemmPlan(DType act_dtype);
// The pipeline's routes and why, for a run's log line, e.g.
// "decode=fp32_fma,batch=amx,prefill=amx (start-up choice: AMX tiles granted,
// oneDNN brg:avx512_core_amx_bf16; per core fp32 FMA 236, bf16 dot 118
// GFLOP/s; found in 1.3 ms)".
std::string GemmRouteDescription(DType act_dtype);

}  // namespace kda
