// The two directories of tests/golden.h. Only this file is compiled with the
// clone's absolute paths (KDA_SOURCE_DIR, KDA_BINARY_DIR), so that every other
// test source compiles the same in any clone and another clone's compiles are
// cache hits.
#include "tests/golden.h"

#include <cstdlib>
#include <string>

namespace kda::testing {

std::string GoldenDir() {
  if (const char* env = std::getenv("KDA_GOLDEN_DIR"); env != nullptr && *env != '\0') return env;
  return GeneratedGoldenDir();
}

std::string GeneratedGoldenDir() { return std::string(KDA_BINARY_DIR) + "/golden"; }

std::string SharedGoldenDir() {
  if (const char* env = std::getenv("KDA_SHARED_GOLDEN_DIR"); env != nullptr) return env;
  return std::string(KDA_SOURCE_DIR) + "/../shared/golden";
}

}  // namespace kda::testing
