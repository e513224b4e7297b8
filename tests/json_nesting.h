// Deeply nested JSON, as fuzzing found it crashing the parsers of input
// headers and config.json (the tests of their refusals).
#pragma once

#include <cstddef>
#include <string>

namespace kda::testing {

// `depth` nested arrays around `inner`: [[...inner...]].
inline std::string Nested(int depth, const std::string& inner) {
  return std::string(static_cast<size_t>(depth), '[') + inner + std::string(static_cast<size_t>(depth), ']');
}

}  // namespace kda::testing
