// The compute entry points of one target (defined in its per-ISA sources,
// collected into its dispatch table by kernels/isa/table_simd.cc). Include only
// from per-ISA sources, after kernels/isa/vec.h.
#pragma once

#include <cstdint>

#include "kda/base/bf16.h"
#include "kda/kernels/short_conv.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/isa/dispatch.h"
#include "kernels/isa/target.h"
#include "kernels/kda/kda_tasks.h"

namespace kda::KDA_TARGET_NS {

// Vector registers of the target (the x86-64 baseline and AVX2 have 16,
// AVX-512 32): a loop's live values must fit in them. The avx512_shape test
// target takes AVX-512's numbers here (its code, not its speed, is the point).
inline constexpr int kVecRegisters = KDA_TARGET_AVX512_SHAPED ? 32 : 16;

// Registers of value columns per block: of the prefill sweep, and of the
// decode passes.
#if KDA_TARGET_AVX512_SHAPED
inline constexpr int kChunkRegs = 2;
inline constexpr int kDecodeRegs = 8;
#elif KDA_TARGET == KDA_TARGET_AVX2
inline constexpr int kChunkRegs = 2;
inline constexpr int kDecodeRegs = 4;
#else
inline constexpr int kChunkRegs = 4;
inline constexpr int kDecodeRegs = 4;
#endif

// kernels/kda/chunk_kda_simd.cc, fused_recurrent_kda_simd.cc
void ChunkKdaTask(const internal::ChunkGroupTask& task);
void FusedRecurrentKdaTask(const internal::RecurrentTask& task);
void ChunkSsdTask(const internal::SsdTask& task);  // kernels/kda/chunk_ssd_simd.cc
int ChunkColumnBlock();

// kernels/conv/short_conv_simd.cc
void ConvChunkF32(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc);
void ConvChunkBF16(const ShortConvArgs& a, const float* wt, int64_t n, int64_t c0, int64_t nc);

// kernels/elementwise/gate_beta_simd.cc
void GateBetaF32(float* g, float* beta, const float* raw, const float* logits, const float* a, const float* dt_bias,
                 int64_t t0, int64_t t1, int H, int K, float lower_bound, float beta_scale);
void GateBetaBF16(float* g, float* beta, const BF16* raw, const BF16* logits, const float* a, const float* dt_bias,
                  int64_t t0, int64_t t1, int H, int K, float lower_bound, float beta_scale);
void GateRow(float* g, const float* bias, float neg_a, int len);
void LowerBoundGateRow(float* g, const float* bias, float a, float lower_bound, int len);

// kernels/elementwise/gated_rms_norm_simd.cc (instantiated for each GateActivation)
template <GateActivation kAct>
void RmsNormF32(float* y, const float* o, const float* gate, const float* w, int64_t r0, int64_t r1, int V, float eps);
template <GateActivation kAct>
void RmsNormBF16(BF16* y, const BF16* o, const BF16* gate, const float* w, int64_t r0, int64_t r1, int V, float eps);
template <SsdNorm kForm>
void RmsNormGroupsF32(float* y, const float* o, const float* z, const float* w, int64_t r0, int64_t r1, int groups,
                      int64_t width, float eps, float* g);
template <SsdNorm kForm>
void RmsNormGroupsBF16(BF16* y, const BF16* o, const BF16* z, const float* w, int64_t r0, int64_t r1, int groups,
                       int64_t width, float eps, float* g);

// kernels/elementwise/residual_add_simd.cc (with the bf16 conversions)
void AddF32(float* acc, const float* x, int64_t i0, int64_t i1);
void AddBF16(BF16* acc, const BF16* x, int64_t i0, int64_t i1);
void ToBF16Range(BF16* y, const float* x, int64_t i0, int64_t i1);
void ToF32Range(float* y, const BF16* x, int64_t i0, int64_t i1);

// kernels/gemm/gemm_simd.cc
void Gemv(const internal::GemvArgs& a, int64_t n0, int64_t n1);
void Q8DequantF32(float* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0, int64_t r1,
                  bool round_bf16);
void Q8DequantBF16(BF16* w, const int8_t* q, const uint16_t* scales, int64_t K, int64_t r0, int64_t r1);

// kernels/gemm/tile_gemm_simd.cc (the AVX-512 target)
void TilePackRows(BF16* xp, const BF16* x, int64_t m, int64_t k, int64_t b);
void TileGemmRows(const internal::TileGemmArgs& a, const internal::TileGemmJob& j, const BF16* xp);

// kernels/isa/table_simd.cc
void VecMath(internal::VecMathOp op, float* y, const float* x, int64_t n);

}  // namespace kda::KDA_TARGET_NS
