// The kda::Error a call throws, for tests that check what an error names.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kda/base/error.h"

namespace kda::testing {

// fn's kda::Error message, or "(no error)" when it returns normally.
inline std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Expects fn to throw a kda::Error whose message contains `what`.
inline void ExpectErrorContaining(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected one containing '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace kda::testing
