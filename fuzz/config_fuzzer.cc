// Fuzzes config.json parsing (ParseModelConfig, every supported model_type). Input: the file's text, run-length
// macros expanded (see fuzz_util.h). Whatever is accepted must satisfy the documented invariants.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_util.h"
#include "kda/base/error.h"
#include "kda/io/config.h"

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return kda::fuzz::MutateWithMacros(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = kda::fuzz::Expand(data, size);
  try {
    const kda::ModelConfig c = kda::ParseModelConfig(text, "config.json");
    if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_k_heads <= 0 || c.num_v_heads <= 0 ||
        c.head_k_dim <= 0 || c.head_v_dim <= 0 || c.conv_size <= 0) {
      std::abort();
    }
    if (c.num_v_heads % c.num_k_heads != 0) std::abort();
    // The reported type is a text model's: never a nested (qwen3_5, qwen3_5_moe) or unsupported one.
    if (c.model_type != "kimi_linear" && c.model_type != "qwen3_next" && c.model_type != "qwen3_5_text" &&
        c.model_type != "qwen3_5_moe_text") {
      std::abort();
    }
    if (c.model_type == "kimi_linear" && (c.num_v_heads != c.num_k_heads || c.head_v_dim != c.head_k_dim)) {
      std::abort();
    }
    if (!(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0)) std::abort();
    if (c.linear_layers.empty() || !std::is_sorted(c.linear_layers.begin(), c.linear_layers.end()) ||
        std::adjacent_find(c.linear_layers.begin(), c.linear_layers.end()) != c.linear_layers.end()) {
      std::abort();
    }
    if (c.linear_layers.front() < 0 || c.linear_layers.back() >= c.num_hidden_layers) std::abort();
    if (c.FirstLinearLayer() != c.linear_layers.front() || !c.IsLinearLayer(c.linear_layers.back())) std::abort();
  } catch (const kda::Error&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
