// Register-only probes of the multiply instructions this process can run
// (kernels/gemm/cpu_probe.cc): the GEMM route's start-up choice
// (kda/kernels/gemm_route.h) and bench-kernels' ceilings read the same loops.
#pragma once

#include <cstdint>

namespace kda {

enum class ProbeInstruction : uint8_t {
  kFma,      // the widest fp32 FMA (AVX-512, AVX2, else scalar): 2 flops per lane
  kBf16Dot,  // vdpbf16ps (AVX512-BF16): 4 flops per fp32 lane
  kAmxBf16,  // tdpbf16ps on 16 x 16 fp32 tiles: 16 * 16 * 32 * 2 flops
  kAmxInt8,  // tdpbssd on 16 x 16 int32 tiles: 16 * 16 * 64 * 2 operations
};

const char* ProbeInstructionName(ProbeInstruction p);

// Whether the CPU has AMX (tiles, bf16, int8) and the OS granted this process
// the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; Linux >= 5.16).
bool AmxTilesGranted();
// Whether this process can run the probe's instruction.
bool CanRunProbe(ProbeInstruction p);

// Runs `iters` rounds of the register-only loop of `p` on the calling thread
// (independent accumulators, enough to cover the instruction's latency) and
// returns the flops (integer operations for kAmxInt8) it did; 0 where the
// instruction cannot run. *sink receives a value of every accumulator.
double RunProbeLoop(ProbeInstruction p, int64_t iters, float* sink);
// Flops per round of RunProbeLoop (0 where the instruction cannot run).
double ProbeFlopsPerRound(ProbeInstruction p);

// The rate of one thread in GFLOP/s: the best of `repeats` timed loops of
// about `seconds` each (a ceiling: the least disturbed run); 0 where the
// instruction cannot run.
double ProbeGflopsOneThread(ProbeInstruction p, double seconds, int repeats);

}  // namespace kda
