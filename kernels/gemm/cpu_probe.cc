// Register-only loops of the multiply instructions (kda/kernels/cpu_probe.h).
#include "kda/kernels/cpu_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
// g++ 12 warns about the intentionally undefined operands in its own AVX-512
// headers (GCC bug 105593); the pragma covers only those headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kda {
namespace {

// Independent accumulators of the vector loops: enough to cover the FMA
// latency at full throughput.
constexpr int kChains = 12;
// Independent tile accumulators of the AMX loops (6 of the 8 tiles; one A
// and one B tile are reused): 6 x 16 cycles cover the tile product's latency.
constexpr int kTileChains = 6;

#if defined(__x86_64__)
// The loop for one vector ISA: VEC its register type, P the prefix of its
// intrinsics (_mm512, _mm256); the accumulators are summed lane by lane.
#define KDA_FMA_LOOP(NAME, TARGET, VEC, P)                                                                \
  __attribute__((target(TARGET))) float NAME(int64_t iters) {                                             \
    VEC acc[kChains];                                                                                     \
    for (int i = 0; i < kChains; ++i) acc[i] = P##_set1_ps(1.0F + 0.001F * static_cast<float>(i));        \
    const VEC mul = P##_set1_ps(0.999999F);                                                               \
    const VEC add = P##_set1_ps(1e-7F);                                                                   \
    for (int64_t it = 0; it < iters; ++it) {                                                              \
      _Pragma("GCC unroll 12") for (int i = 0; i < kChains; ++i) acc[i] = P##_fmadd_ps(acc[i], mul, add); \
    }                                                                                                     \
    VEC sum = acc[0];                                                                                     \
    for (int i = 1; i < kChains; ++i) sum = P##_add_ps(sum, acc[i]);                                      \
    float lanes[sizeof(VEC) / sizeof(float)];                                                             \
    P##_storeu_ps(lanes, sum);                                                                            \
    float r = 0.0F;                                                                                       \
    for (float x : lanes) r += x;                                                                         \
    return r;                                                                                             \
  }
KDA_FMA_LOOP(FmaLoopAvx512, "avx512f", __m512, _mm512)
KDA_FMA_LOOP(FmaLoopAvx2, "avx2,fma", __m256, _mm256)
#undef KDA_FMA_LOOP

// vdpbf16ps: per fp32 lane two bf16 products added to the accumulator, in as
// many chains as the FMA loop, so that the two rates compare instruction for
// instruction.
__attribute__((target("avx512bf16,avx512f"))) float Bf16DotLoopAvx512(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0F + 0.001F * static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999F), _mm512_set1_ps(1e-3F));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4F), _mm512_set1_ps(-1e-4F));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

// The tile configuration (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0..5 accumulate the product of tiles 6 and 7 (loaded once from small
// values), bf16 (tdpbf16ps) or int8 (tdpbssd).
__attribute__((target("amx-tile,amx-bf16,amx-int8"))) float AmxLoop(int64_t iters, bool int8) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t operand[512];
  std::fill_n(operand, 512, uint16_t{0x3C00});  // bf16 0.0078125; int8 bytes 0 and 60
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  // Six independent accumulators a round (the tile numbers are immediates).
#define KDA_TILE_ROUND(OP) \
  OP(0, 6, 7);             \
  OP(1, 6, 7);             \
  OP(2, 6, 7);             \
  OP(3, 6, 7);             \
  OP(4, 6, 7);             \
  OP(5, 6, 7)
  if (int8) {
    for (int64_t i = 0; i < iters; ++i) {
      KDA_TILE_ROUND(_tile_dpbssd);
    }
  } else {
    for (int64_t i = 0; i < iters; ++i) {
      KDA_TILE_ROUND(_tile_dpbf16ps);
    }
  }
#undef KDA_TILE_ROUND
  alignas(64) float out[256];
  _tile_stored(5, out, 64);
  _tile_release();
  return out[0];
}

bool AskForTiles() {
  unsigned eax = 0;
  unsigned ebx = 0;
  unsigned ecx = 0;
  unsigned edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  constexpr unsigned kAmxBf16 = 1U << 22;
  constexpr unsigned kAmxTile = 1U << 24;
  constexpr unsigned kAmxInt8 = 1U << 25;
  if ((edx & (kAmxBf16 | kAmxTile | kAmxInt8)) != (kAmxBf16 | kAmxTile | kAmxInt8)) return false;
  // Linux keeps the tile data state off until a process asks for it.
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kArchGetXcompPerm = 0x1022;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0) return false;
  return (granted & (1ULL << kXfeatureXtiledata)) != 0;
}
#endif

// Multiply-adds of the portable build (the compiler may vectorise them).
float FmaLoopScalar(int64_t iters) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = 1.0F + 0.001F * static_cast<float>(i);
  for (int64_t it = 0; it < iters; ++it) {
    for (float& a : acc) a = a * 0.999999F + 1e-7F;
  }
  float r = 0.0F;
  for (float a : acc) r += a;
  return r;
}

int FmaLanes() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
  return 1;
}

}  // namespace

const char* ProbeInstructionName(ProbeInstruction p) {
  switch (p) {
    case ProbeInstruction::kFma:
      return "fp32 FMA";
    case ProbeInstruction::kBf16Dot:
      return "bf16 dot";
    case ProbeInstruction::kAmxBf16:
      return "AMX bf16";
    case ProbeInstruction::kAmxInt8:
      return "AMX int8";
  }
  return "?";
}

bool AmxTilesGranted() {
#if defined(__x86_64__)
  static const bool granted = AskForTiles();
  return granted;
#else
  return false;
#endif
}

bool CanRunProbe(ProbeInstruction p) {
  switch (p) {
    case ProbeInstruction::kFma:
      return true;
    case ProbeInstruction::kBf16Dot:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512bf16") != 0;
#else
      return false;
#endif
    case ProbeInstruction::kAmxBf16:
    case ProbeInstruction::kAmxInt8:
      return AmxTilesGranted();
  }
  return false;
}

double ProbeFlopsPerRound(ProbeInstruction p) {
  if (!CanRunProbe(p)) return 0.0;
  switch (p) {
    case ProbeInstruction::kFma:
      return kChains * FmaLanes() * 2.0;
    case ProbeInstruction::kBf16Dot:
      return kChains * 16 * 4.0;
    case ProbeInstruction::kAmxBf16:
      return kTileChains * 16.0 * 16.0 * 32.0 * 2.0;
    case ProbeInstruction::kAmxInt8:
      return kTileChains * 16.0 * 16.0 * 64.0 * 2.0;
  }
  return 0.0;
}

double RunProbeLoop(ProbeInstruction p, int64_t iters, float* sink) {
  if (!CanRunProbe(p)) return 0.0;
  float v = 0.0F;
  switch (p) {
    case ProbeInstruction::kFma:
#if defined(__x86_64__)
      if (FmaLanes() == 16) {
        v = FmaLoopAvx512(iters);
      } else if (FmaLanes() == 8) {
        v = FmaLoopAvx2(iters);
      } else {
        v = FmaLoopScalar(iters);
      }
#else
      v = FmaLoopScalar(iters);
#endif
      break;
#if defined(__x86_64__)
    case ProbeInstruction::kBf16Dot:
      v = Bf16DotLoopAvx512(iters);
      break;
    case ProbeInstruction::kAmxBf16:
    case ProbeInstruction::kAmxInt8:
      v = AmxLoop(iters, p == ProbeInstruction::kAmxInt8);
      break;
#else
    default:
      break;
#endif
  }
  *sink += v;
  return static_cast<double>(iters) * ProbeFlopsPerRound(p);
}

double ProbeGflopsOneThread(ProbeInstruction p, double seconds, int repeats) {
  if (!CanRunProbe(p)) return 0.0;
  using Clock = std::chrono::steady_clock;
  float sink = 0.0F;
  const auto timed = [&](int64_t iters) {
    const Clock::time_point t0 = Clock::now();
    const double flops = RunProbeLoop(p, iters, &sink);
    return std::pair<double, double>(flops, std::chrono::duration<double>(Clock::now() - t0).count());
  };
  // A short loop sizes the timed ones.
  int64_t iters = 256;
  const double s0 = timed(iters).second;
  if (s0 > 0.0) iters = std::max<int64_t>(iters, static_cast<int64_t>(static_cast<double>(iters) * seconds / s0));
  double best = 0.0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto [flops, s] = timed(iters);
    if (s > 0.0) best = std::max(best, flops / s);
  }
  if (sink == 42.0F) std::memset(&sink, 0, sizeof(sink));  // keeps the loops observable
  return best / 1e9;
}

}  // namespace kda
