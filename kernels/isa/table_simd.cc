// The dispatch table of one target (compiled once per instruction set, see
// kernels/isa/target.h), and its vector-math probe for the tests.
#include <cstdint>

#include "kda/kernels/kernel_isa.h"
#include "kernels/isa/dispatch.h"
#include "kernels/isa/target_kernels.h"
#include "kernels/isa/vec.h"

namespace kda::KDA_TARGET_NS {
namespace {

// One op over a register of lanes (Vec) or one lane (the ops the element-wise
// kernels use per lane).
template <class Vt>
KDA_INLINE typename Vt::Reg Apply(internal::VecMathOp op, typename Vt::Reg x) {
  switch (op) {
    case internal::VecMathOp::kExp:
      return Exp<Vt>(x);
    case internal::VecMathOp::kSigmoid:
      return Sigmoid<Vt>(x);
    case internal::VecMathOp::kSilu:
      return Silu<Vt>(x);
    default:
      return x;
  }
}

}  // namespace

void VecMath(internal::VecMathOp op, float* y, const float* x, int64_t n) {
  int64_t i = 0;
  switch (op) {
    case internal::VecMathOp::kExp:
    case internal::VecMathOp::kSigmoid:
    case internal::VecMathOp::kSilu:
      for (; i + Vec::kLanes <= n; i += Vec::kLanes) Vec::Store(y + i, Apply<Vec>(op, Vec::Load(x + i)));
      for (; i < n; ++i) y[i] = Apply<Scalar>(op, x[i]);
      return;
    case internal::VecMathOp::kRoundBF16:
      for (; i + Vec::kLanes <= n; i += Vec::kLanes) {
        BF16 b[Vec::kLanes];
        StoreBF16<Vec>(b, Vec::Load(x + i));
        Vec::Store(y + i, LoadBF16<Vec>(b));
      }
      for (; i < n; ++i) {
        BF16 b;
        StoreBF16<Scalar>(&b, x[i]);
        y[i] = LoadBF16<Scalar>(&b);
      }
      return;
    case internal::VecMathOp::kSoftplus:
      for (; i < n; ++i) y[i] = Softplus(x[i]);
      return;
    case internal::VecMathOp::kLog:
      for (; i < n; ++i) y[i] = Log(x[i]);
      return;
  }
}

const internal::KernelTable& Table() {
  static const internal::KernelTable table = [] {
    internal::KernelTable t{};  // aggregate initialisation: no shared inline constructor
#if KDA_TARGET == KDA_TARGET_AVX512
    t.isa = KernelIsa::kAvx512;
#elif KDA_TARGET == KDA_TARGET_AVX2
    t.isa = KernelIsa::kAvx2;
#elif KDA_TARGET == KDA_TARGET_AVX512_SHAPE
    t.isa = KernelIsa::kAvx512Shape;
#else
    t.isa = KernelIsa::kGeneric;
#endif
    t.chunk_task = &ChunkKdaTask;
    t.recurrent_task = &FusedRecurrentKdaTask;
#if KDA_TARGET == KDA_TARGET_AVX2
    // Mamba2's SSD prefill in chunked form where it was measured no slower than the recurrent sweep (Zen 3);
    // the other targets keep the sweep (chunk_ssd_simd.cc compiles for them all).
    t.ssd_task = &ChunkSsdTask;
#endif
    t.column_block = ChunkColumnBlock();
    t.lanes = Vec::kLanes;
    t.conv_chunk_f32 = &ConvChunkF32;
    t.conv_chunk_bf16 = &ConvChunkBF16;
    t.gate_beta_f32 = &GateBetaF32;
    t.gate_beta_bf16 = &GateBetaBF16;
    t.gate_row = &GateRow;
    t.rms_norm_f32[static_cast<int>(GateActivation::kSigmoid)] = &RmsNormF32<GateActivation::kSigmoid>;
    t.rms_norm_f32[static_cast<int>(GateActivation::kSilu)] = &RmsNormF32<GateActivation::kSilu>;
    t.rms_norm_bf16[static_cast<int>(GateActivation::kSigmoid)] = &RmsNormBF16<GateActivation::kSigmoid>;
    t.rms_norm_bf16[static_cast<int>(GateActivation::kSilu)] = &RmsNormBF16<GateActivation::kSilu>;
    t.rms_norm_groups_f32[static_cast<int>(SsdNorm::kGateThenNorm)] = &RmsNormGroupsF32<SsdNorm::kGateThenNorm>;
    t.rms_norm_groups_f32[static_cast<int>(SsdNorm::kNormThenGate)] = &RmsNormGroupsF32<SsdNorm::kNormThenGate>;
    t.rms_norm_groups_f32[static_cast<int>(SsdNorm::kGateOnly)] = &RmsNormGroupsF32<SsdNorm::kGateOnly>;
    t.rms_norm_groups_bf16[static_cast<int>(SsdNorm::kGateThenNorm)] = &RmsNormGroupsBF16<SsdNorm::kGateThenNorm>;
    t.rms_norm_groups_bf16[static_cast<int>(SsdNorm::kNormThenGate)] = &RmsNormGroupsBF16<SsdNorm::kNormThenGate>;
    t.rms_norm_groups_bf16[static_cast<int>(SsdNorm::kGateOnly)] = &RmsNormGroupsBF16<SsdNorm::kGateOnly>;
    t.add_f32 = &AddF32;
    t.add_bf16 = &AddBF16;
    t.to_bf16 = &ToBF16Range;
    t.to_f32 = &ToF32Range;
    t.gemv = &Gemv;
    t.q8_dequant_f32 = &Q8DequantF32;
    t.q8_dequant_bf16 = &Q8DequantBF16;
#if KDA_TARGET == KDA_TARGET_AVX512
    t.tile_pack_rows = &TilePackRows;
    t.tile_gemm_rows = &TileGemmRows;
#endif
    t.vec_math = &VecMath;
    return t;
  }();
  return table;
}

}  // namespace kda::KDA_TARGET_NS
