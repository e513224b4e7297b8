// The geometry of one delta-rule layer, Kimi Delta Attention or Gated DeltaNet
// (layers/delta_rule_geometry.cc): what the layer handle, the attention
// backend, the weights and the state pool are sized by.
//
// hidden model width; H key heads of K dims, HV = r * H value heads of V dims
// (value head h reads key head h / r); W the short conv width over the
// concatenated q|k|v channels (2*H*K + HV*V). The log decay g is one value
// per key dimension (KDA: [HV, K], HV = H) or per value head (GDN: [HV]).
// The gated RMSNorm's gate goes through output_gate (KDA sigmoid, GDN silu).
// The variant settings below are the rest of what a model family's
// transformers layer fixes (docs/model-families.md): the gate's form, beta's
// range, and two cast points of the bf16 pipeline. None changes a size.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "kda/kernels/elementwise.h"
#include "kda/mem_cache/recurrent_state_spec.h"

namespace kda {

enum class DecayWidth : uint8_t { kPerKeyDim, kPerValueHead };

struct DeltaRuleGeometry {
  int64_t hidden = 0;
  int H = 0;   // key heads
  int HV = 0;  // value heads, a multiple of H
  int K = 0;   // key head dim
  int V = 0;   // value head dim
  int W = 0;   // short conv width
  double rms_norm_eps = 1e-5;
  DecayWidth decay = DecayWidth::kPerKeyDim;
  GateActivation output_gate = GateActivation::kSigmoid;
  // The forget gate from the raw gate f and dt_bias (fp32): 0 for the
  // softplus gate -exp(A_log) * softplus(f + dt_bias); L < 0 for the
  // lower-bound gate L * sigmoid(exp(A_log) * (f + dt_bias)), g in (L, 0)
  // (GLM-5 Next's linear_lower_bound, Bailing's kda_safe_gate).
  float gate_lower_bound = 0.0F;
  // beta = beta_scale * sigmoid(b): 1, or 2 to let the transition's
  // eigenvalues go negative (OLMo hybrid's linear_allow_neg_eigval).
  float beta_scale = 1.0F;
  // The activated gate rounded to the activation dtype before the kernel
  // (Bailing casts g to the hidden states' dtype); a no-op in fp32.
  bool gate_in_act_dtype = false;
  // The conv weights kept fp32 in the bf16 pipeline (GLM-5 Next and Bailing
  // keep their conv1d in float32); otherwise rounded to bf16 like the rest.
  bool conv_weights_f32 = false;
  // Mamba2's SSD mixer (Granite-4.0-H, Nemotron-H, Bamba, Codestral): the same
  // layer without the delta rule. H = G groups of B and C (the key heads; K =
  // the state size N), HV heads of V = P dims (head h reads group h / r). No
  // delta correction, no L2 norm of B and C, scale 1; dt = clamp(softplus(
  // dt_raw + dt_bias), [dt_min, dt_max]) is beta and g = -exp(A_log) dt; y =
  // o + D x; the conv runs over x|B|C (v|k|q) with a bias; the gated norm is
  // y * silu(z) normalised over the r heads of a group (weight [HV * V]);
  // states are [HV, V, K] (transformers' [H, P, N]).
  bool ssd = false;
  float dt_min = 0.0F;
  float dt_max = std::numeric_limits<float>::infinity();
  // Falcon-H1's variants of the mixer: the gated norm's form (the norm before the gate, or the gate alone with
  // no norm weight), and the factors of in_proj's output parts z, x, B, C, dt (its ssm_in_multiplier times
  // ssm_multipliers' part, each finite; 1 elsewhere), applied to the fp32 projections before their one
  // rounding, in every forward mode.
  SsdNorm ssd_norm = SsdNorm::kGateThenNorm;
  // The tensor-parallel ranks that share each key head (a shard of one key head's value heads, see
  // HeadShard): 1, or that many consecutive ranks, whose gated norm of a Mamba2 group sums its squares
  // across them.
  int head_split = 1;
  std::array<float, 5> ssd_multipliers = {1.0F, 1.0F, 1.0F, 1.0F, 1.0F};
  bool ssd_scaled() const { return ssd_multipliers != std::array<float, 5>{1.0F, 1.0F, 1.0F, 1.0F, 1.0F}; }

  // A KDA layer: H = HV heads of K = V dims, per-key-dim decay, sigmoid output gate.
  static DeltaRuleGeometry Kda(int64_t hidden, int heads, int head_dim, int conv_width, double eps);
  // A GDN layer: per-value-head decay, silu output gate.
  static DeltaRuleGeometry Gdn(int64_t hidden, int key_heads, int value_heads, int head_k_dim, int head_v_dim,
                               int conv_width, double eps);
  // A Mamba2 mixer: `heads` heads of head_dim, state size `state`, `groups` groups of B and C.
  static DeltaRuleGeometry Mamba2(int64_t hidden, int heads, int head_dim, int state, int groups, int conv_width,
                                  double eps);

  int group() const { return H > 0 ? HV / H : 0; }  // r, value heads per key head
  int64_t key_dim() const { return int64_t{H} * K; }
  int64_t value_dim() const { return int64_t{HV} * V; }
  int64_t conv_channels() const { return 2 * key_dim() + value_dim(); }
  // The first conv channel of q, k and v: q|k|v, or Mamba2's x|B|C (v|k|q).
  int64_t q_channel() const { return ssd ? value_dim() + key_dim() : 0; }
  int64_t k_channel() const { return ssd ? value_dim() : key_dim(); }
  int64_t v_channel() const { return ssd ? 0 : 2 * key_dim(); }
  // Decay values per value head (K or 1) and per token (HV * that).
  int decay_per_head() const { return decay == DecayWidth::kPerKeyDim ? K : 1; }
  int64_t gate_width() const { return int64_t{HV} * decay_per_head(); }
  // One layer's recurrent state of a request as callers see it: [HV, K, V], or a Mamba2 mixer's [H, P, N]
  // ([HV, V, K], transformers' cache).
  std::array<int64_t, 3> state_dims() const {
    return ssd ? std::array<int64_t, 3>{HV, V, K} : std::array<int64_t, 3>{HV, K, V};
  }
  // The per-request state one layer keeps; a verify position holds the conv
  // inputs, the raw gate and the beta logits (conv_channels + gate_width + HV).
  RecurrentStateSpec state_spec() const;

  // kda::Error naming the problem unless the geometry is one the kernels and
  // layers take (positive sizes, HV a multiple of H, K and V in [1, 256], a
  // finite gate_lower_bound <= 0, beta_scale 1 or 2; an SSD mixer: a decay per
  // value head, none of the delta-rule variants, 0 <= dt_min <= dt_max, finite multipliers; the Falcon-H1
  // variants only on an SSD mixer).
  void Validate(const std::string& who) const;
  // The layer of key heads [begin, begin + count) (and their value heads):
  // H = count, HV = count * r, everything else unchanged; split > 1: a part of
  // one key head's value heads (count 1, HV = r / split, head_split = split).
  DeltaRuleGeometry Shard(int begin, int count, int split = 1) const;
  bool operator==(const DeltaRuleGeometry&) const = default;
};

}  // namespace kda
