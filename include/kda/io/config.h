// The parts of a Hugging Face config.json that kda's delta-rule layers need,
// for every supported model type (io/config.cc):
//   kimi_linear                         KDA (Kimi-Linear): linear_attn_config.{num_heads, head_dim,
//                                       short_conv_kernel_size, kda_layers (1-based)}
//   qwen3_next, qwen3_5, qwen3_5_text,  Gated DeltaNet: linear_num_key_heads, linear_num_value_heads,
//   qwen3_5_moe, qwen3_5_moe_text       linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim,
//                                       layer_types ("linear_attention" entries; without it, every layer
//                                       but each full_attention_interval-th); qwen3_5 and qwen3_5_moe keep
//                                       the text model under text_config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kda {

struct ModelConfig {
  // The text model's model_type (kimi_linear, qwen3_next, qwen3_5_text, qwen3_5_moe_text; a nested
  // qwen3_5 / qwen3_5_moe config reports its text_config's type, or the top-level type + "_text"
  // when text_config names none).
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  double rms_norm_eps = 1e-5;      // also the gated norm's eps (Kimi default 1e-5, Qwen 1e-6)
  int num_k_heads = 0;             // H (Kimi: num_heads)
  int num_v_heads = 0;             // HV, a multiple of H (Kimi: num_heads)
  int head_k_dim = 0;              // K (Kimi: head_dim; the top-level head_dim is legacy, ignored)
  int head_v_dim = 0;              // V (Kimi: head_dim)
  int conv_size = 0;               // W, the short conv width
  std::vector<int> linear_layers;  // 0-based, sorted, distinct: the delta-rule layers

  bool IsLinearLayer(int layer) const;
  // The lowest delta-rule layer; kda::Error when there is none.
  int FirstLinearLayer() const;
};

// The model types ParseModelConfig accepts, for messages and --help.
const std::vector<std::string>& SupportedModelTypes();

// Parses config.json text; `origin` (usually the file path) starts every error message. The model_type
// picks the fields (above); a config without model_type is read as kimi_linear (Kimi-Linear's own
// configs carry linear_attn_config; the error for a missing one says how an untyped config was read).
// Required fields are positive integers; rms_norm_eps, when present, a finite number > 0;
// num_v_heads a multiple of num_k_heads; at least one delta-rule layer. Gated DeltaNet configs: defaults
// linear_conv_kernel_dim 4, full_attention_interval 4, rms_norm_eps 1e-6; layer_types (null is absent),
// when given, has num_hidden_layers entries; num_hidden_layers at most 65536 (the layer list may be
// implied); a nested text_config's model_type, when given, is one of the flat Gated DeltaNet types.
// Each problem is a kda::Error naming the field (text_config.* for nested configs); an unsupported
// model_type is one naming it and the supported ones.
ModelConfig ParseModelConfig(const std::string& json_text, const std::string& origin);

// Reads MODEL_DIR/config.json ("config.json not found in MODEL_DIR" when absent).
ModelConfig LoadModelConfig(const std::string& model_dir);

}  // namespace kda
