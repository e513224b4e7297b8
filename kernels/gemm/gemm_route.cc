// The GEMM route (kda/kernels/gemm_route.h): what this process can run, the
// start-up choice per class of rows, and the one switch (SetGemmPlan /
// KDA_GEMM_ROUTE / the start-up choice).
#include "kda/kernels/gemm_route.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "base/named_choice.h"
#include "kda/base/error.h"
#include "kda/kernels/cpu_probe.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/gemm/gemm_internal.h"

namespace kda {
namespace {

// In the enum's order.
constexpr const char* kRouteNames[] = {"auto", "bf16_dot", "fp32_fma", "amx"};
constexpr const char* kRowsNames[] = {"decode", "batch", "prefill"};
constexpr GemmRows kAllRows[] = {GemmRows::kDecode, GemmRows::kBatch, GemmRows::kPrefill};

// oneDNN takes the tiles for every bf16 matmul it can once its instruction
// set allows them, whichever route is asked (it has no per-product choice),
// and fixes that set at its first primitive: where KDA_GEMM_ROUTE names a
// route for every class and none is amx, the tiles are kept off for the
// process, so that the bf16 dot is what runs.
bool EnvRulesOutTiles() {
  const char* text = std::getenv("KDA_GEMM_ROUTE");
  if (text == nullptr || text[0] == '\0') return false;
  try {
    const GemmPlan plan = ParseGemmPlan(text);
    for (GemmRows rows : kAllRows) {
      if (plan.For(rows) == GemmRoute::kAuto || plan.For(rows) == GemmRoute::kAmx) return false;
    }
    return true;
  } catch (const Error&) {
    return false;  // reported where the route is needed
  }
}

// What this process can run, found once: the CPU's bf16 dot, the tile unit
// (granted by the OS and reached by oneDNN's bf16 matmul), and the
// register-only rates of one core's fp32 FMA and bf16 dot.
struct Engines {
  bool bf16_dot = false;
  bool amx = false;
  std::string amx_impl;          // oneDNN's implementation of a bf16 matmul on the tiles
  bool tiles_ruled_out = false;  // KDA_GEMM_ROUTE names a route for every class, none the tiles
  double fma_gflops = 0.0;
  double dot_gflops = 0.0;
  double decided_ms = 0.0;
  Engines() {
    const auto t0 = std::chrono::steady_clock::now();
    bf16_dot = CanRunProbe(ProbeInstruction::kBf16Dot);
    if (AmxTilesGranted()) {
      tiles_ruled_out = EnvRulesOutTiles();
      if (tiles_ruled_out) {
        internal::CapOneDnnBelowTiles();
      } else {
        amx_impl = internal::OneDnnTileImplementation();
      }
      amx = !amx_impl.empty();
    }
    // About 1 ms a rate: the choice between the two is a factor of two either
    // way on the CPUs measured (docs/projections.md).
    constexpr double kProbeSeconds = 3e-4;
    constexpr int kProbeRepeats = 3;
    fma_gflops = ProbeGflopsOneThread(ProbeInstruction::kFma, kProbeSeconds, kProbeRepeats);
    if (bf16_dot) dot_gflops = ProbeGflopsOneThread(ProbeInstruction::kBf16Dot, kProbeSeconds, kProbeRepeats);
    decided_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

const Engines& Found() {
  static const Engines engines;
  return engines;
}

// Whether the route runs under the kernels' instruction set `isa` (KDA_ISA):
// the bf16 dot and the tiles need the avx512 kernels.
bool Runs(GemmRoute route, KernelIsa isa) {
  switch (route) {
    case GemmRoute::kAuto:
    case GemmRoute::kF32Fma:
      return true;
    case GemmRoute::kBf16Dot:
      return Found().bf16_dot && isa == KernelIsa::kAvx512;
    case GemmRoute::kAmx:
      return Found().amx && isa == KernelIsa::kAvx512;
  }
  return false;
}

// The start-up choice for a class under `isa`: the tiles for batches and
// prefill where they run, else the faster instruction per core.
GemmRoute StartupRoute(GemmRows rows, KernelIsa isa) {
  if (isa != KernelIsa::kAvx512) return GemmRoute::kF32Fma;
  const Engines& e = Found();
  if (rows != GemmRows::kDecode && e.amx) return GemmRoute::kAmx;
  return e.bf16_dot && e.dot_gflops > e.fma_gflops ? GemmRoute::kBf16Dot : GemmRoute::kF32Fma;
}

// The forced plan packed into an int for EnvSetting (two bits a class).
enum class PackedPlan : int {};
PackedPlan Pack(const GemmPlan& p) {
  return static_cast<PackedPlan>(static_cast<int>(p.decode) | (static_cast<int>(p.batch) << 2) |
                                 (static_cast<int>(p.prefill) << 4));
}
GemmPlan Unpack(PackedPlan packed) {
  const int v = static_cast<int>(packed);
  return {static_cast<GemmRoute>(v & 3), static_cast<GemmRoute>((v >> 2) & 3), static_cast<GemmRoute>((v >> 4) & 3)};
}

EnvSetting<PackedPlan>& Env() {
  static EnvSetting<PackedPlan> env("KDA_GEMM_ROUTE", Pack(GemmPlan{}));
  return env;
}

GemmPlan Forced() {
  return Unpack(Env().Get([](const char* text) { return Pack(ParseGemmPlan(text)); }));
}

std::string Unsupported(GemmRoute route) {
  std::string why;
  const Engines& e = Found();
  if (route == GemmRoute::kBf16Dot && !e.bf16_dot) {
    why = "the CPU has no AVX512-BF16";
  } else if (route == GemmRoute::kAmx && !e.amx) {
    why = !AmxTilesGranted() ? "no AMX tile state granted to this process"
          : e.tiles_ruled_out
              ? "KDA_GEMM_ROUTE named every class without amx at start-up, so oneDNN was kept off the tiles"
              : "oneDNN has no bf16 matmul on the tiles";
  } else {
    why = std::string("it needs the avx512 kernels; KDA_ISA is ") + KernelIsaName(ActiveKernelIsa());
  }
  return std::string("GEMM route '") + GemmRouteName(route) + "' cannot run here (" + why + ")";
}

void CheckRuns(const GemmPlan& plan, KernelIsa isa) {
  for (GemmRows rows : kAllRows) {
    const GemmRoute r = plan.For(rows);
    Check(Runs(r, isa), [r] { return Unsupported(r); });
  }
}

}  // namespace

GemmRows GemmRowsOf(int64_t m) {
  if (m <= kGemmDecodeMaxRows) return GemmRows::kDecode;
  return m <= kGemmBatchMaxRows ? GemmRows::kBatch : GemmRows::kPrefill;
}

const char* GemmRowsName(GemmRows rows) { return NameOf(rows, kRowsNames); }

namespace {

// The plan's field for a class (const or not).
template <class Plan>
auto& FieldOf(Plan& plan, GemmRows rows) {
  switch (rows) {
    case GemmRows::kDecode:
      return plan.decode;
    case GemmRows::kBatch:
      return plan.batch;
    case GemmRows::kPrefill:
      break;
  }
  return plan.prefill;
}

}  // namespace

GemmRoute GemmPlan::For(GemmRows rows) const { return FieldOf(*this, rows); }

GemmRoute& GemmPlan::At(GemmRows rows) { return FieldOf(*this, rows); }

GemmRoute ParseGemmRoute(const std::string& name) { return ParseNamed<GemmRoute>(name, kRouteNames, "GEMM route"); }

const char* GemmRouteName(GemmRoute route) { return NameOf(route, kRouteNames); }

GemmPlan ParseGemmPlan(const std::string& text) {
  if (text.find('=') == std::string::npos) return GemmPlan::All(ParseGemmRoute(text));
  GemmPlan plan;
  bool named[kGemmRowClasses] = {};
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t eq = part.find('=');
    Check(eq != std::string::npos, "GEMM routes: '" + part + "' is not CLASS=ROUTE");
    const auto rows = ParseNamed<GemmRows>(part.substr(0, eq), kRowsNames, "class of rows");
    Check(!named[static_cast<int>(rows)], "GEMM routes: class '" + part.substr(0, eq) + "' named twice");
    named[static_cast<int>(rows)] = true;
    plan.At(rows) = ParseGemmRoute(part.substr(eq + 1));
  }
  return plan;
}

std::string GemmPlanName(const GemmPlan& plan) {
  std::string s;
  for (GemmRows rows : kAllRows) {
    s += std::string(s.empty() ? "" : ",") + GemmRowsName(rows) + "=" + GemmRouteName(plan.For(rows));
  }
  return s;
}

bool CpuSupportsGemmRoute(GemmRoute route) { return Runs(route, ActiveKernelIsa()); }

void SetGemmRoute(GemmRoute route) { SetGemmPlan(GemmPlan::All(route)); }

void SetGemmPlan(const GemmPlan& plan) {
  CheckRuns(plan, ActiveKernelIsa());
  if (plan == GemmPlan{}) {
    Env().Unset();
  } else {
    Env().Set(Pack(plan));
  }
}

GemmPlan ActiveGemmPlan() {
  GemmPlan plan = Forced();
  // Checked on every use: KDA_ISA may change what can run.
  const KernelIsa isa = ActiveKernelIsa();
  CheckRuns(plan, isa);
  for (GemmRows rows : kAllRows) {
    if (plan.For(rows) == GemmRoute::kAuto) plan.At(rows) = StartupRoute(rows, isa);
  }
  return plan;
}

GemmRoute ActiveGemmRoute(int64_t m) { return ActiveGemmPlan().ForRows(m); }

GemmPlan PipelineGemmPlan(DType act_dtype) {
  return act_dtype == DType::kF32 ? GemmPlan::All(GemmRoute::kF32Fma) : ActiveGemmPlan();
}

std::string GemmRouteDescription(DType act_dtype) {
  if (act_dtype == DType::kF32) return GemmPlanName(PipelineGemmPlan(act_dtype)) + " (the fp32 pipeline)";
  const GemmPlan plan = ActiveGemmPlan();
  const GemmPlan forced = Forced();
  const Engines& e = Found();
  char rates[256];
  std::snprintf(rates, sizeof(rates), "per core fp32 FMA %.0f, bf16 dot %.0f GFLOP/s; found in %.1f ms", e.fma_gflops,
                e.dot_gflops, e.decided_ms);
  std::string why;
  if (forced == GemmPlan::All(forced.decode) && forced.decode != GemmRoute::kAuto) {
    why = "forced (SetGemmRoute or KDA_GEMM_ROUTE)";
  } else {
    why = forced == GemmPlan{} ? "start-up choice"
                               : "forced in part (SetGemmPlan or KDA_GEMM_ROUTE), else start-up choice";
    why += std::string(": ") +
           (e.amx ? "AMX tiles granted, oneDNN " + e.amx_impl
                  : (AmxTilesGranted() ? "AMX tiles granted, no oneDNN bf16 matmul on them" : "no AMX tiles"));
    if (ActiveKernelIsa() != KernelIsa::kAvx512) why += std::string(", KDA_ISA ") + KernelIsaName(ActiveKernelIsa());
  }
  if (e.tiles_ruled_out) why += "; oneDNN kept off the tiles";
  if (e.amx && (plan.batch == GemmRoute::kBf16Dot || plan.prefill == GemmRoute::kBf16Dot)) {
    why += "; oneDNN runs bf16_dot's products of more than 16 rows on the tiles where its brgemm takes them";
  }
  return GemmPlanName(plan) + " (" + why + "; " + rates + ")";
}

namespace internal {

void FindGemmEngines() { Found(); }

void ResetGemmRouteForTesting() { Env().Reset(); }

}  // namespace internal
}  // namespace kda
