// The element-wise parts of the KDA layer, each a plain reference and a
// vectorised version (compiled for AVX-512, AVX2 and generic x86-64; the
// variant is the one ActiveKernelIsa() names, see kda/kernels/kernel_isa.h).
//
// T tokens, H heads, K = V head dim, P = H*K.
#pragma once

#include <cstdint>

#include "kda/base/dtype.h"

namespace kda {

// The forms of the forget gate and of beta (DeltaRuleGeometry's variant settings).
struct GateForm {
  float lower_bound = 0.0F;  // 0: the softplus gate; < 0: the lower-bound gate (below)
  float beta_scale = 1.0F;   // beta = beta_scale * sigmoid(logit): 1, or 2 (negative eigenvalues)
};

// Forget gate and beta (design §2.4), fp32 outputs:
//   g[t, c]    = -exp(A_log[c / K]) * softplus(raw[t, c] + dt_bias[c])            g [T, P], raw [T, P]
//     or, with form.lower_bound L < 0: L * sigmoid(exp(A_log[c / K]) * (raw[t, c] + dt_bias[c]))
//   beta[t, h] = form.beta_scale * sigmoid(logits[t, h])                         beta, logits [T, H]
// raw and logits are F32 or BF16. (Gated DeltaNet: K = 1, one gate per value head.)
void KdaGateBeta(float* g, float* beta, ConstBuf raw, ConstBuf logits, const float* A_log, const float* dt_bias,
                 int64_t T, int H, int K, GateForm form = {});
void KdaGateBetaReference(float* g, float* beta, ConstBuf raw, ConstBuf logits, const float* A_log,
                          const float* dt_bias, int64_t T, int H, int K, GateForm form = {});

// Mamba2's step size and log decay (fp32), per token and head:
//   dt[t, h] = clamp(softplus(raw[t, h] + dt_bias[h]), dt_min, dt_max),  g[t, h] = -exp(A_log[h]) * dt[t, h]
// softplus(x) = x for x > 20 (torch's threshold). raw [T, H] F32 or BF16; g, dt [T, H].
void SsdGateDt(float* g, float* dt, ConstBuf raw, const float* A_log, const float* dt_bias, int64_t T, int H,
               float dt_min, float dt_max);

// The same forget gate over one head's row, in place: the in-kernel gate of
// the optimized KDA kernels (use_gate_in_kernel). Reference: KdaGate per
// element. g [len] holds the raw gate on entry; bias [len] or null.
void KdaGateRowInPlace(float* g, const float* bias, float A_log, int len);

// The gate activation of the gated RMSNorm: sigmoid(z) = 1 / (1 + e^-z) (KDA),
// or silu(z) = z * sigmoid(z) (Gated DeltaNet: Qwen3-Next, Qwen3.5).
enum class GateActivation : uint8_t { kSigmoid, kSilu };
// "sigmoid" or "silu".
const char* GateActivationName(GateActivation act);

// Gated RMSNorm per token and head over V (design §2.6), fp32 arithmetic in
// one expression:
//   y[t, h, :] = o * rsqrt(mean(o^2) + eps) * w * act(gate)
// y, o, gate [T, H, V] F32 or BF16 (y rounded once); w [V]. act: sigmoid, or
// silu computed as gate * sigmoid(gate) in fp32.
void GatedRmsNorm(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps,
                  GateActivation act);
void GatedRmsNormReference(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps,
                           GateActivation act);

// Where a Mamba2 mixer's gated norm puts the silu gate (transformers'
// MambaRMSNormGated and Falcon-H1's variants): before the norm (every family's,
// norm_before_gate False), after it (Falcon-H1's mamba_norm_before_gate), or
// the gate alone without a norm (Falcon-H1 without mamba_rms_norm).
enum class SsdNorm : uint8_t { kGateThenNorm, kNormThenGate, kGateOnly };
// "gate_then_norm", "norm_then_gate" or "gate_only".
const char* SsdNormName(SsdNorm form);

// Mamba2's gated RMSNorm: the mean over groups of `width` channels (several
// heads each), a weight per channel of the row. Per token t and group j, over
// the group's channels c, fp32 arithmetic in one expression, silu(z) = z *
// sigmoid(z):
//   kGateThenNorm: g[c] = o[t, c] * silu(z[t, c]),  y[t, c] = g[c] * rsqrt(mean_j(g^2) + eps) * w[c]
//   kNormThenGate: y[t, c] = o[t, c] * rsqrt(mean_j(o^2) + eps) * w[c] * silu(z[t, c])
//   kGateOnly:     y[t, c] = o[t, c] * silu(z[t, c])   (w and eps unused; w may be null)
// y, o, z [T, groups * width] F32 or BF16, one dtype (y rounded once; g kept
// in fp32); w [groups * width] fp32. T >= 0, groups and width > 0.
void GatedRmsNormGroups(MutBuf y, ConstBuf o, ConstBuf z, const float* w, int64_t T, int groups, int64_t width,
                        float eps, SsdNorm form = SsdNorm::kGateThenNorm);
void GatedRmsNormGroupsReference(MutBuf y, ConstBuf o, ConstBuf z, const float* w, int64_t T, int groups, int64_t width,
                                 float eps, SsdNorm form = SsdNorm::kGateThenNorm);

// The same norm in two steps, for groups whose channels are split over tensor-parallel ranks (each holding
// `width` of a group's `count` channels): ss[t * groups + j] = the sum over the group's channels here of
// the squares the norm averages (g^2, or o^2 before the gate; kGateOnly: 0), fp32 in channel order; then,
// with every rank's sums added into ss, y as GatedRmsNormGroups writes it with the mean over `count`
// channels: rsqrt(ss / count + eps). ss [T * groups]; count >= width. GatedRmsNormGroupsReference is
// the two with count = width.
void GatedRmsNormGroupsSquares(float* ss, ConstBuf o, ConstBuf z, int64_t T, int groups, int64_t width, SsdNorm form);
void GatedRmsNormGroupsFromSquares(MutBuf y, ConstBuf o, ConstBuf z, const float* w, const float* ss, int64_t count,
                                   int64_t T, int groups, int64_t width, float eps, SsdNorm form);

// The residual add between layers: acc[i] = acc[i] + x[i] for i < n, summed
// in fp32 and rounded once to the dtype. acc, x [n], both F32 or both BF16.
void AddInPlace(MutBuf acc, ConstBuf x, int64_t n);
void AddInPlaceReference(MutBuf acc, ConstBuf x, int64_t n);

// bf16 conversions: y[i] = round-to-nearest-even(x[i]) (NaN kept a quiet
// NaN), and the exact widening back. y, x [n].
void ConvertToBF16(BF16* y, const float* x, int64_t n);
void ConvertToBF16Reference(BF16* y, const float* x, int64_t n);
void ConvertToFloat(float* y, const BF16* x, int64_t n);
void ConvertToFloatReference(float* y, const BF16* x, int64_t n);

}  // namespace kda
