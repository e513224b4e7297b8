// The parts of a Hugging Face Kimi-Linear config.json that the KDA layers need.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kda {

struct KimiLinearConfig {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  double rms_norm_eps = 1e-5;   // also the o_norm eps
  int num_heads = 0;            // linear_attn_config.num_heads (H)
  int head_dim = 0;             // linear_attn_config.head_dim (K = V); the top-level head_dim is legacy, ignored
  int conv_size = 0;            // linear_attn_config.short_conv_kernel_size (W)
  std::vector<int> kda_layers;  // 0-based, sorted, distinct; the file lists them 1-based

  bool IsKdaLayer(int layer) const;
  // The lowest KDA layer; kda::Error when there is none.
  int FirstKdaLayer() const;
  // P = H * K, the width of the q/k/v projections.
  int64_t projection_size() const { return int64_t{num_heads} * head_dim; }
};

// Parses config.json text; `origin` (usually the file path) starts every error message. Required: positive
// integers hidden_size, num_hidden_layers and linear_attn_config.{num_heads, head_dim, short_conv_kernel_size};
// linear_attn_config.kda_layers, a non-empty array of distinct 1-based layer numbers in [1, num_hidden_layers].
// Optional: rms_norm_eps (> 0, default 1e-5). Each problem is a kda::Error naming the field.
KimiLinearConfig ParseKimiLinearConfig(const std::string& json_text, const std::string& origin);

// Reads MODEL_DIR/config.json ("config.json not found in MODEL_DIR" when absent).
KimiLinearConfig LoadKimiLinearConfig(const std::string& model_dir);

}  // namespace kda
