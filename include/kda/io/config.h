// The parts of a Hugging Face config.json that kda's delta-rule layers need: what each layer family's
// config reader fills (models/families/, the field names and defaults of the family's transformers 5.25
// config class; ParseModelConfig in kda/models/layer_family.h).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace kda {

struct ModelConfig {
  // The text model's model_type: a flat config's own (but glm5_next_text for a glm5_next config without
  // text_config); a nested qwen3_5 / qwen3_5_moe / glm5_next / qwen4_exp config's text_config.model_type,
  // or the top-level type + "_text" when text_config names none.
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  double rms_norm_eps = 1e-5;      // also the gated norm's eps but olmo_hybrid's (1e-5 fixed); default
                                   // 1e-5 for kimi_linear and glm5_next, 1e-6 for the others
  int num_k_heads = 0;             // H (KDA: the heads)
  int num_v_heads = 0;             // HV, a multiple of H (KDA: H)
  int head_k_dim = 0;              // K (Kimi: head_dim; its top-level head_dim is legacy, ignored)
  int head_v_dim = 0;              // V (KDA: K)
  int conv_size = 0;               // W, the short conv width
  std::vector<int> linear_layers;  // 0-based, sorted, distinct: the delta-rule layers
  // Variant settings (each family reads those of its own model type):
  // KDA's lower-bound gate g = L * sigmoid(exp(A_log) * (f + dt_bias)), L finite and < 0 (glm5_next,
  // bailing_hybrid); none: the softplus gate.
  std::optional<double> gate_lower_bound;
  bool allow_neg_eigval = false;       // beta = 2 * sigmoid(b) (olmo_hybrid's linear_allow_neg_eigval)
  std::string output_gate_activation;  // "" (the family's own), "sigmoid" or "silu" (qwen4_exp, always set)
  // Mamba2 mixers: the layers are SSD mixers (num_k_heads: the groups of B and C, num_v_heads the heads,
  // head_k_dim the state size, head_v_dim the head dim), dt clamped to time_step_limit [dt_min, dt_max].
  bool ssd = false;
  double dt_min = 0.0;
  double dt_max = std::numeric_limits<double>::infinity();
  // Falcon-H1: the gated norm (mamba_rms_norm; without it y * silu(z) alone) and its order
  // (mamba_norm_before_gate: rms(y) * weight * silu(z)); in_proj's output parts z, x, B, C, dt scaled by
  // ssm_in_multiplier times ssm_multipliers (1 elsewhere).
  bool ssd_rms_norm = true;
  bool ssd_norm_before_gate = false;
  std::array<double, 5> ssd_multipliers = {1.0, 1.0, 1.0, 1.0, 1.0};

  bool IsLinearLayer(int layer) const;
  // The lowest delta-rule layer; kda::Error when there is none.
  int FirstLinearLayer() const;
};

}  // namespace kda
