// Locating the golden cases. Every test runs on the sets the project's own
// float64 reference writes into the build tree at test time
// (tests/generate_golden.cmake, the golden_generate fixture), or on
// $KDA_GOLDEN_DIR's; sets named "generated/<set>" are read from the build tree
// always. The independent sets of ../shared/golden (or $KDA_SHARED_GOLDEN_DIR;
// empty: none), named "shared/<set>", run in addition in the golden layer
// tests where that directory exists. Missing golden data skips the golden
// tests visibly, or fails them when KDA_REQUIRE_GOLDEN=1.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace kda::testing {

// $KDA_GOLDEN_DIR, else GeneratedGoldenDir() (tests/golden.cc).
std::string GoldenDir();

// Where the golden_generate fixture writes its sets (tests/golden.cc).
std::string GeneratedGoldenDir();

// ../shared/golden beside the source tree, or $KDA_SHARED_GOLDEN_DIR (tests/golden.cc).
std::string SharedGoldenDir();

inline constexpr const char* kGeneratedPrefix = "generated/";
inline constexpr const char* kSharedPrefix = "shared/";

// The directory of a golden set: "kda-mini" under GoldenDir(),
// "generated/kda-real" under GeneratedGoldenDir(), "shared/kda-mini" under
// SharedGoldenDir().
inline std::string GoldenSetDir(const std::string& set) {
  const std::string generated = kGeneratedPrefix;
  const std::string shared = kSharedPrefix;
  if (set.rfind(generated, 0) == 0) return GeneratedGoldenDir() + "/" + set.substr(generated.size());
  if (set.rfind(shared, 0) == 0) return SharedGoldenDir() + "/" + set.substr(shared.size());
  return GoldenDir() + "/" + set;
}

inline bool GoldenRequired() {
  const char* env = std::getenv("KDA_REQUIRE_GOLDEN");
  return env != nullptr && std::string(env) == "1";
}

// Why `path` may be missing: for generated sets, the fixture's note.
inline std::string GoldenMissingReason(const std::string& path) {
  if (path.rfind(GeneratedGoldenDir(), 0) != 0) return "set KDA_GOLDEN_DIR";
  std::ifstream note(GeneratedGoldenDir() + "/NOT_GENERATED");
  if (!note) return "not generated: run the golden_generate test first (ctest runs it for the tests that need it)";
  std::ostringstream s;
  s << note.rdbuf();
  std::string r = s.str();
  while (!r.empty() && (r.back() == '\n' || r.back() == ' ')) r.pop_back();
  return "not generated: " + r;
}

// A golden case of a parameterised test: its set (as GoldenSetDir takes it) and its name.
struct GoldenCase {
  std::string dir;
  std::string name;
};

// The cases `names` of the set `set`, and parts of a case list one after another.
inline std::vector<GoldenCase> CasesOf(const std::string& set, const std::vector<std::string>& names) {
  std::vector<GoldenCase> cases;
  cases.reserve(names.size());
  for (const std::string& n : names) cases.push_back({set, n});
  return cases;
}
inline std::vector<GoldenCase> Concat(std::initializer_list<std::vector<GoldenCase>> parts) {
  std::vector<GoldenCase> all;
  for (const std::vector<GoldenCase>& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// `cases`, then the same cases of ../shared/golden's independent sets
// ("shared/<set>") for each set that directory holds: where it exists, they
// run in addition; where it does not, they are not listed (nothing skips).
inline std::vector<GoldenCase> WithSharedSets(std::vector<GoldenCase> cases) {
  const size_t n = cases.size();
  for (size_t i = 0; i < n; ++i) {
    const GoldenCase c = cases[i];
    if (c.dir.find('/') != std::string::npos) continue;  // generated/ or shared/ already
    const std::string shared = std::string(kSharedPrefix) + c.dir;
    if (std::filesystem::exists(GoldenSetDir(shared) + "/" + c.name + ".safetensors"))
      cases.push_back({shared, c.name});
  }
  return cases;
}

inline void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.dir << "/" << c.name; }

// The case's part of a test name: "<dir>_<name>", '-' and '/' as '_'.
inline std::string GoldenCaseName(const ::testing::TestParamInfo<GoldenCase>& info) {
  std::string s = info.param.dir + "_" + info.param.name;
  for (char& c : s) {
    if (c == '-' || c == '/') c = '_';
  }
  return s;
}

}  // namespace kda::testing

// Skips (or fails under KDA_REQUIRE_GOLDEN=1) when `path` does not exist.
#define KDA_REQUIRE_GOLDEN_PATH(path)                                                                                  \
  do {                                                                                                                 \
    if (!std::filesystem::exists(path)) {                                                                              \
      const std::string kda_reason_ = ::kda::testing::GoldenMissingReason(path);                                       \
      if (::kda::testing::GoldenRequired()) FAIL() << "golden data missing: " << (path) << " (" << kda_reason_ << ")"; \
      GTEST_SKIP() << "golden data missing: " << (path) << " (" << kda_reason_ << ")";                                 \
    }                                                                                                                  \
  } while (0)
