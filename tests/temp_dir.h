// A fixture whose tests each get a directory of their own under the gtest
// temp dir, for the files a test writes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

namespace kda::testing {

// dir_: <TempDir>/kda_<suite>_<test>_<pid> ('/' of parameterised names as
// '_'), made empty in SetUp and removed with all it holds in TearDown. A
// fixture with more to set up calls TempDirTest::SetUp() from its own.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        std::string("kda_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid());
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::path(::testing::TempDir()) / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

}  // namespace kda::testing
