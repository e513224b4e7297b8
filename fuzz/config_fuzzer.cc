// Fuzzes config.json parsing (ParseKimiLinearConfig). Input: the file's text, run-length macros expanded (see
// fuzz_util.h). Whatever is accepted must satisfy the documented invariants.
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
    const kda::KimiLinearConfig c = kda::ParseKimiLinearConfig(text, "config.json");
    if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_heads <= 0 || c.head_dim <= 0 || c.conv_size <= 0) {
      std::abort();
    }
    if (!(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0)) std::abort();
    if (c.kda_layers.empty() || !std::is_sorted(c.kda_layers.begin(), c.kda_layers.end()) ||
        std::adjacent_find(c.kda_layers.begin(), c.kda_layers.end()) != c.kda_layers.end()) {
      std::abort();
    }
    if (c.kda_layers.front() < 0 || c.kda_layers.back() >= c.num_hidden_layers) std::abort();
    if (c.FirstKdaLayer() != c.kda_layers.front() || !c.IsKdaLayer(c.kda_layers.back())) std::abort();
  } catch (const kda::Error&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
