// The dispatch table of the per-ISA kernels: one table per instruction set,
// filled by kernels/isa/table_simd.cc (compiled once per target), and the one
// switch that picks a table, ActiveKernelIsa() (SetKernelIsa / KDA_ISA /
// the CPU's best). The host code of every optimized kernel (validation,
// scratch, the split into jobs, threads) calls its compute code through the
// table of the active ISA.
#pragma once

#include <cstdint>

#include "kda/base/bf16.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/kernel_isa.h"
#include "kda/kernels/short_conv.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/kda/kda_tasks.h"

namespace kda::internal {

// The gate activations (GateActivation, values 0 .. kGateActivationCount - 1): the
// length of the gated RMSNorm's entries.
inline constexpr int kGateActivationCount = 2;
static_assert(static_cast<int>(GateActivation::kSigmoid) == 0 && static_cast<int>(GateActivation::kSilu) == 1);

// What the vector-math probe evaluates (tests compare each ISA's primitives with libm).
enum class VecMathOp : uint8_t { kExp, kSigmoid, kSilu, kSoftplus, kLog, kRoundBF16 };

struct KernelTable {
  KernelIsa isa = KernelIsa::kGeneric;

  // KDA core (kernels/kda/chunk_kda_simd.cc, fused_recurrent_kda_simd.cc).
  void (*chunk_task)(const ChunkGroupTask& task) = nullptr;
  void (*recurrent_task)(const RecurrentTask& task) = nullptr;
  // Mamba2's SSD prefill in chunked form (kernels/kda/chunk_ssd_simd.cc): chunk_kda calls with a scalar gate and
  // no delta correction, where set (null: the recurrent sweep, chunk_task).
  void (*ssd_task)(const SsdTask& task) = nullptr;
  int column_block = 16;  // value columns per register block of the prefill sweep
  int lanes = 1;          // floats per vector register

  // Short conv + SiLU (kernels/conv/short_conv_simd.cc): channels [c0, c0 + nc) of
  // sequence n, wt the [W, C] weight at channel c0 (taps C apart); x and y of
  // one dtype (the F32 or the BF16 variant).
  void (*conv_chunk_f32)(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) = nullptr;
  void (*conv_chunk_bf16)(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc) = nullptr;

  // Forget gate and beta over token rows [t0, t1) (kernels/elementwise/gate_beta_simd.cc): per head
  // a[h] = -exp(A_log[h]) for the softplus gate (lower_bound 0), exp(A_log[h]) for the lower-bound gate.
  void (*gate_beta_f32)(float* g, float* beta, const float* raw, const float* logits, const float* a,
                        const float* dt_bias, int64_t t0, int64_t t1, int H, int K, float lower_bound,
                        float beta_scale) = nullptr;
  void (*gate_beta_bf16)(float* g, float* beta, const BF16* raw, const BF16* logits, const float* a,
                         const float* dt_bias, int64_t t0, int64_t t1, int H, int K, float lower_bound,
                         float beta_scale) = nullptr;
  // The gate of one row in place (bias or null).
  void (*gate_row)(float* g, const float* bias, float neg_a, int len) = nullptr;

  // Gated RMSNorm over rows [r0, r1) of [T*H, V] (kernels/elementwise/gated_rms_norm_simd.cc), one
  // entry per gate activation, indexed by its value.
  void (*rms_norm_f32[kGateActivationCount])(float* y, const float* o, const float* gate, const float* w, int64_t r0,
                                             int64_t r1, int V, float eps) = {};
  void (*rms_norm_bf16[kGateActivationCount])(BF16* y, const BF16* o, const BF16* gate, const float* w, int64_t r0,
                                              int64_t r1, int V, float eps) = {};
  // Mamba2's gated RMSNorm over rows [r0, r1) of [T*groups, width] (same file), indexed by SsdNorm (the
  // silu gate before the norm, after it, or alone), the weight of group r % groups at w + (r % groups) * width;
  // g [width] fp32 scratch.
  void (*rms_norm_groups_f32[3])(float* y, const float* o, const float* z, const float* w, int64_t r0, int64_t r1,
                                 int groups, int64_t width, float eps, float* g) = {};
  void (*rms_norm_groups_bf16[3])(BF16* y, const BF16* o, const BF16* z, const float* w, int64_t r0, int64_t r1,
                                  int groups, int64_t width, float eps, float* g) = {};

  // Residual add and bf16 conversions over elements [i0, i1) (kernels/elementwise/residual_add_simd.cc).
  void (*add_f32)(float* acc, const float* x, int64_t i0, int64_t i1) = nullptr;
  void (*add_bf16)(BF16* acc, const BF16* x, int64_t i0, int64_t i1) = nullptr;
  void (*to_bf16)(BF16* y, const float* x, int64_t i0, int64_t i1) = nullptr;
  void (*to_f32)(float* y, const BF16* x, int64_t i0, int64_t i1) = nullptr;

  // Projections (kernels/gemm/gemm_simd.cc): output columns [n0, n1) of the
  // small-M product (Q8, fp32 or bf16 weights); rows [r0, r1) of a Q8 weight
  // [*, K] dequantized into w (fp32, optionally rounded to bf16 values; or
  // bf16), w indexed r * K + k.
  void (*gemv)(const GemvArgs& a, int64_t n0, int64_t n1) = nullptr;
  void (*q8_dequant_f32)(float* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0, int64_t r1,
                         bool round_bf16) = nullptr;
  void (*q8_dequant_bf16)(BF16* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0,
                          int64_t r1) = nullptr;

  // The AMX tile GEMM (kernels/gemm/tile_gemm_simd.cc; the AVX-512 target only, else null): input
  // rows [16 b, 16 b + 16) of x [m, k] packed for the tiles into xp (block b at b * 16 * k, rows
  // past m zero), and weight rows [r0, r1) at w (row r0's, readable to a multiple of 32 rows)
  // against all packed rows.
  void (*tile_pack_rows)(BF16* xp, const BF16* x, int64_t m, int64_t k, int64_t b) = nullptr;
  void (*tile_gemm_rows)(const TileGemmArgs& a, const TileGemmJob& j, const BF16* xp) = nullptr;

  // y[i] = op(x[i]) for i < n through the vector primitives (kernels/isa/vec.h), for tests.
  void (*vec_math)(VecMathOp op, float* y, const float* x, int64_t n) = nullptr;
};

// The table of `isa` (kAuto: the active one). Throws kda::Error if this CPU
// or build lacks it.
const KernelTable& KernelsFor(KernelIsa isa);
// The table of ActiveKernelIsa().
const KernelTable& ActiveKernels();

}  // namespace kda::internal

// Each target's table, defined by kernels/isa/table_simd.cc compiled for it. On
// builds for other than x86-64 only the generic target exists
// (KDA_X86_TARGETS unset).
#define KDA_DECLARE_TARGET_TABLE(ns)    \
  namespace kda::ns {                   \
  const internal::KernelTable& Table(); \
  }
KDA_DECLARE_TARGET_TABLE(N_GENERIC)
KDA_DECLARE_TARGET_TABLE(N_AVX2)
KDA_DECLARE_TARGET_TABLE(N_AVX512)
KDA_DECLARE_TARGET_TABLE(N_AVX512_SHAPE)
#undef KDA_DECLARE_TARGET_TABLE
