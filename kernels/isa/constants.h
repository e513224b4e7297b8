// The constants of the CPU kernels (reference and optimized), in one place.
#pragma once

#include <cstdint>

namespace kda::kc {

// ------------------------------------------------------------ KDA core

// Largest head dim the KDA kernels accept (validated); sizes stack rows.
inline constexpr int kMaxHeadDim = 256;

// eps of the in-kernel L2 norm: x / sqrt(sum x^2 + eps).
inline constexpr float kL2NormEps = 1e-6F;

// Smallest scale factor c of a stored state row of the optimized prefill
// before the row is materialised (kernels/kda/chunk_kda_simd.cc). Shat = S / c stays
// below |S| * 2^64, far from fp32 overflow, and scale q c stays a normal number.
inline constexpr float kStateRowMinScale = 0x1p-64F;

// Prefill tokens are prepared in blocks of this many rows (per-token decay
// vectors), then swept once per value-column block.
inline constexpr int kTokenBlock = 32;

// Heads of one sequence that a prefill task advances in lockstep, block by
// block: their rows of a token share pages, so their input streams share TLB
// entries (one head alone walks a new page per row).
inline constexpr int kHeadGroup = 4;

// Cache lines of one token's rows to prefetch (q, k, g, v and the output o at
// K, V <= 256 in fp32, unaligned, and beta).
inline constexpr int kMaxLinesPerToken = 5 * 17 + 1;

// Software prefetch of the prefill's input rows: each line about this many
// tokens before the preparation that reads it (chunk_kda_simd.cc).
inline constexpr int kPrefetchAhead = 2;

// The update passes of the prefill take the state rows in groups of this many:
// one prefetched line per group, and the materialisation multiply only on the
// groups that hold a materialised row (one bit per group in a uint32_t).
inline constexpr int kPassRowGroup = 8;
static_assert(kMaxHeadDim / kPassRowGroup <= 32, "a token's row groups must fit in 32 bits");

// The chunked form of Mamba2's SSD prefill (kernels/kda/chunk_ssd_simd.cc): tokens per chunk (kSnapshotGrain:
// snapshots fall on chunk ends, and the intra-chunk product, about L V flops per token and head beside the 4 K V
// of the readout and the update, stays small),
// tokens whose q and k rows a task prepares at a time (whole chunks), and the most value heads of one key head a
// task advances together (their working states in the worker's scratch).
inline constexpr int kSsdChunk = 32;
inline constexpr int kSsdSpan = 256;
inline constexpr int kSsdMaxHeads = 32;

// ------------------------------------------------------------ short conv

inline constexpr int kConvMaxWidth = 16;         // wider convs take the reference path
inline constexpr int64_t kConvChunk = 512;       // channels per job
inline constexpr int kConvPrefetchAhead = 2;     // tokens
inline constexpr int kConvMaxRegisterWidth = 4;  // widths summed in registers (Kimi-Linear's is 4)

// ------------------------------------------------------------ element-wise

inline constexpr int64_t kRowsPerJob = 16;               // gate/beta token rows per job (RMSNorm: 4x)
inline constexpr int64_t kAddPerJob = int64_t{1} << 16;  // residual add / bf16 conversion elements per job
// Mamba2's gated RMSNorm: at least this many elements per worker (whole rows; small calls take fewer).
inline constexpr int64_t kNormGroupsMinPerWorker = 8192;

// softplus(x) = x above this (log1p(e^x) equals x to fp32 precision there).
inline constexpr float kSoftplusThreshold = 20.0F;

// ------------------------------------------------------------ e^x

// Exp's input range: e^88 < FLT_MAX; below kExpMin (2^-126, the smallest
// normal) the result is 0 (the libm result there is subnormal or 0).
inline constexpr float kExpMax = 88.0F;
inline constexpr float kExpMin = -87.33654F;
inline constexpr float kSmallestNormal = 0x1p-126F;  // FLT_MIN
inline constexpr float kLog2E = 1.44269504088896341F;
// ln 2 = kLn2Hi + kLn2Lo (Cody-Waite: n * kLn2Hi is exact for |n| <= 127).
inline constexpr float kLn2Hi = 0.693359375F;
inline constexpr float kLn2Lo = -2.12194440e-4F;

}  // namespace kda::kc
