// Locating the golden cases: $KDA_GOLDEN_DIR, else ../shared/golden beside the
// source tree. Missing golden data skips the golden tests visibly, or fails
// them when KDA_REQUIRE_GOLDEN=1.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kda::testing {

inline std::string GoldenDir() {
  if (const char* env = std::getenv("KDA_GOLDEN_DIR"); env != nullptr && *env != '\0') return env;
  return std::string(KDA_SOURCE_DIR) + "/../shared/golden";
}

inline bool GoldenRequired() {
  const char* env = std::getenv("KDA_REQUIRE_GOLDEN");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace kda::testing

// Skips (or fails under KDA_REQUIRE_GOLDEN=1) when `path` does not exist.
#define KDA_REQUIRE_GOLDEN_PATH(path)                                                    \
  do {                                                                                   \
    if (!std::filesystem::exists(path)) {                                                \
      if (::kda::testing::GoldenRequired()) FAIL() << "golden data missing: " << (path); \
      GTEST_SKIP() << "golden data missing: " << (path) << " (set KDA_GOLDEN_DIR)";      \
    }                                                                                    \
  } while (0)
