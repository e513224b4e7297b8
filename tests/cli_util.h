// Running the `kda` CLI from tests: its path ($KDA_CLI, else build/kda) and a
// launcher that captures status, stdout and stderr under a time limit.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/io/safetensors.h"
#include "tests/temp_dir.h"
#include "tests/tolerance.h"

namespace kda::testing {

inline std::string CliPath() {
  const char* env = std::getenv("KDA_CLI");
  return env != nullptr ? env : "build/kda";
}

struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};

// A fixture for tests that run the CLI: skipped without its binary, and a
// directory of the test's own in dir_ (TempDirTest).
class CliTestBase : public TempDirTest {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(CliPath())) GTEST_SKIP() << "CLI binary not found at " << CliPath();
    TempDirTest::SetUp();
  }
};

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `prefix kda args` with a time limit (`limit_s`; status 124 when it
// ran out), so a hang is a failure, not a stall.
inline CliResult RunKda(const std::string& prefix, const std::string& args, int limit_s = 100) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir());
  const std::filesystem::path out = dir / ("kda_dist_cli_stdout_" + std::to_string(::getpid()) + ".txt");
  const std::filesystem::path err = dir / ("kda_dist_cli_stderr_" + std::to_string(::getpid()) + ".txt");
  const std::string cmd = "timeout -k 5 " + std::to_string(limit_s) + " " + prefix + (prefix.empty() ? "" : " ") +
                          CliPath() + " " + args + " >" + out.string() + " 2>" + err.string();
  const int raw = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = Slurp(out);
  r.err = Slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

// The tensors `kda run` wrote (`got`) against a golden case (`want`): out and
// the final states within the fp32 rule, or out and the recurrent state within
// the bf16 rule (design §5; the bf16 conv tail is checked by the caller).
inline void ExpectRunOutputMatchesGolden(const SafetensorsFile& got, const SafetensorsFile& want, bool bf16) {
  const std::vector<float> o = ToFloatVector(got.Get("out"));
  const std::vector<float> s = ToFloatVector(got.Get("final_recurrent_state"));
  if (!bf16) {
    const std::vector<float> c = ToFloatVector(got.Get("final_conv_state"));
    EXPECT_TRUE(AllCloseF32(o.data(), ToFloatVector(want.Get("out_fp32")).data(), o.size()));
    EXPECT_TRUE(AllCloseF32(s.data(), ToFloatVector(want.Get("final_recurrent_state")).data(), s.size()));
    EXPECT_TRUE(AllCloseF32(c.data(), ToFloatVector(want.Get("final_conv_state")).data(), c.size()));
  } else {
    EXPECT_TRUE(AllCloseBF16(o.data(), ToFloatVector(want.Get("out_bf16")).data(),
                             ToFloatVector(want.Get("out_fp32")).data(), o.size()));
    EXPECT_TRUE(AllCloseBF16(s.data(), ToFloatVector(want.Get("final_recurrent_state_bf16")).data(),
                             ToFloatVector(want.Get("final_recurrent_state")).data(), s.size()));
  }
}

// An input file for `kda run --prefix-cache` on kda-mini (hidden 512): three
// sequences whose rows the input_ids determine, a (300 tokens), b (a's first
// 280 and 100 more) and a again; cu_seqlens {0, 300, 680, 980}. Served one at
// a time with snapshots every 64 tokens, b reuses a's 256 snapshot and the
// repeat all of a (556 rows).
inline int64_t WritePrefixCacheInput(const std::string& path) {
  constexpr int64_t kHidden = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> table(64 * kHidden);
  for (float& v : table) v = RoundBF16(normal(rng));
  std::vector<int64_t> a(300);
  for (int64_t& t : a) t = static_cast<int64_t>(rng() % 64);
  std::vector<int64_t> ids = a;
  ids.insert(ids.end(), a.begin(), a.begin() + 280);
  for (int i = 0; i < 100; ++i) ids.push_back(static_cast<int64_t>(rng() % 64));
  ids.insert(ids.end(), a.begin(), a.end());
  const std::vector<int32_t> cu = {0, 300, 680, 980};
  std::vector<float> x;
  for (int64_t t : ids) x.insert(x.end(), table.begin() + t * kHidden, table.begin() + (t + 1) * kHidden);
  const auto T = static_cast<int64_t>(ids.size());
  WriteSafetensors(path, {{"hidden_states", DType::kF32, {T, kHidden}, x.data()},
                          {"cu_seqlens", DType::kI32, {4}, cu.data()},
                          {"input_ids", DType::kI64, {T}, ids.data()}});
  return T;
}

}  // namespace kda::testing
