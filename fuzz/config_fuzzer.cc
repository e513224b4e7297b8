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
#include "kda/models/layer_family.h"

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
    // The reported type is a text model's, one a family serves: never a nested (qwen3_5, glm5_next, ...) or
    // unsupported one. A KDA family's heads are as many and as wide for keys and values.
    const kda::LayerFamily& family = kda::LayerFamilyFor(c.model_type);  // kda::Error here would be a bug
    bool flat = false;
    for (const kda::ModelTypeName& t : family.model_types) {
      flat = flat || (t.name == c.model_type && t.nesting == kda::ConfigNesting::kFlat);
    }
    if (!flat) std::abort();
    const kda::DeltaRuleGeometry g = family.geometry(c);
    if (g.decay == kda::DecayWidth::kPerKeyDim && (c.num_v_heads != c.num_k_heads || c.head_v_dim != c.head_k_dim)) {
      std::abort();
    }
    if (g.H != c.num_k_heads || g.HV != c.num_v_heads || g.K != c.head_k_dim || g.V != c.head_v_dim) std::abort();
    if (!(g.gate_lower_bound <= 0.0F && std::isfinite(g.gate_lower_bound))) std::abort();
    // A Mamba2 mixer: the SSD layer, its dt clamp an interval of non-negative steps, the lower end finite (the
    // upper may be Infinity, as Python's json and transformers' {"__float__": ...} write it; never NaN).
    if (g.ssd != c.ssd || (c.ssd && !(std::isfinite(c.dt_min) && c.dt_min >= 0 && c.dt_min <= c.dt_max))) {
      std::abort();
    }
    if (!(std::isfinite(g.dt_min) && g.dt_min >= 0.0F && g.dt_min <= g.dt_max)) std::abort();
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
