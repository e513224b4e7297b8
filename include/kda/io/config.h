// The parts of a Hugging Face config.json that kda's delta-rule layers need, for every supported model type
// (io/config.cc), read with the defaults of transformers 5.25's config classes:
//   kimi_linear                         KDA (Kimi-Linear): linear_attn_config.{num_heads, head_dim,
//                                       short_conv_kernel_size, kda_layers (1-based)}
//   qwen3_next, qwen3_5, qwen3_5_text,  Gated DeltaNet: linear_num_key_heads, linear_num_value_heads,
//   qwen3_5_moe, qwen3_5_moe_text       linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim,
//                                       layer_types ("linear_attention" entries; without it, every layer
//                                       but each full_attention_interval-th); qwen3_5 and qwen3_5_moe keep
//                                       the text model under text_config.
//   glm5_next, glm5_next_text           KDA: linear_num_heads (64), linear_head_dim (128), linear_conv_kernel_dim
//                                       (4), linear_lower_bound (-5; null: none), each overridden by a
//                                       linear_attn_config's num_heads, head_dim, short_conv_kernel_size,
//                                       gate_lower_bound (its safe_gate, default true, makes a missing bound -5);
//                                       layer_types, else every 4th layer attention; glm5_next keeps the text
//                                       model under text_config, or at the top level when that is absent or null.
//   bailing_hybrid                      KDA: num_attention_heads (32), head_dim (128), short_conv_kernel_size (4),
//                                       kda_lower_bound (-5) when kda_safe_gate (true); layer_types, else every
//                                       layer_group_size-th (6) layer attention.
//   olmo_hybrid                         Gated DeltaNet, Qwen's field names: head counts default to
//                                       num_attention_heads (30), the key dim to int(0.75 * hidden_size / key
//                                       heads), the value dim to twice the key dim; linear_allow_neg_eigval
//                                       (true); layer_types (with an attention layer), else every 4th layer
//                                       attention, and the last when that makes none.
//   lara_mini                           Gated DeltaNet, Qwen's fields with defaults H 8, HV 16, K 128, V 128;
//                                       layer_types, else linear, sliding, linear, full, sliding, repeated.
//   qwen4_exp, qwen4_exp_text           Gated DeltaNet, Qwen's fields with defaults H 16, HV 32, K 128, V 128;
//                                       output_gate_type (null, absent or "": hidden_act, default "silu"), "sigmoid"
//                                       or "silu"; qwen4_exp keeps the text model under text_config.
// Every type but kimi_linear: linear_conv_kernel_dim / short_conv_kernel_size default 4; layer_types entries are
// "linear_attention" (a delta-rule layer) or the type's other layer types ("full_attention"; glm5_next and
// qwen4_exp also "indexed_attention", lara_mini "sliding_attention").
#pragma once

#include <cstdint>
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

  bool IsLinearLayer(int layer) const;
  // The lowest delta-rule layer; kda::Error when there is none.
  int FirstLinearLayer() const;
};

// The model types ParseModelConfig accepts, for messages and --help.
const std::vector<std::string>& SupportedModelTypes();

// Parses config.json text; `origin` (usually the file path) starts every error message. The model_type
// picks the fields (above); a config without model_type is read as kimi_linear (Kimi-Linear's own
// configs carry linear_attn_config; the error for a missing one says how an untyped config was read).
// hidden_size and num_hidden_layers are required for every type, and the Qwen3-Next / Qwen3.5 head fields;
// sizes are positive integers; rms_norm_eps, when present, a finite number > 0; lower bounds finite
// numbers < 0; booleans true or false; num_v_heads a multiple of num_k_heads; at least one delta-rule layer.
// Defaults: linear_conv_kernel_dim 4, full_attention_interval 4, rms_norm_eps as above; layer_types (null
// is absent), when given, has num_hidden_layers entries; num_hidden_layers at most 65536 but for kimi_linear
// (the layer list may be implied); a nested text_config's model_type, when given, is one of the text types
// the top-level type names (qwen3_5, qwen3_5_moe: qwen3_next, qwen3_5_text, qwen3_5_moe_text; glm5_next:
// glm5_next_text; qwen4_exp: qwen4_exp_text). Each problem is a kda::Error naming the field (text_config.*
// for nested configs); an unsupported model_type is one naming it and the supported ones.
ModelConfig ParseModelConfig(const std::string& json_text, const std::string& origin);

// Reads MODEL_DIR/config.json ("config.json not found in MODEL_DIR" when absent).
ModelConfig LoadModelConfig(const std::string& model_dir);

}  // namespace kda
