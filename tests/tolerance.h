// The tolerance rules of design §5 as gtest assertions.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "kda/base/tolerance.h"

namespace kda::testing {

inline ::testing::AssertionResult AsAssertion(const ToleranceReport& r, const float* a, const float* ref) {
  if (r.ok) return ::testing::AssertionSuccess() << r.Summary();
  auto f = ::testing::AssertionFailure() << r.Summary();
  if (r.outside > 0) f << "; got " << a[r.first_bad] << " want " << ref[r.first_bad];
  return f;
}

// fp32 rule: every element |a - r| <= atol + rtol |r| (default 1e-5 each).
inline ::testing::AssertionResult AllCloseF32(const float* a, const float* r, size_t n, double atol = 1e-5,
                                              double rtol = 1e-5) {
  return AsAssertion(CompareF32(a, r, n, atol, rtol), a, r);
}

// bf16 rule of design §5.
inline ::testing::AssertionResult AllCloseBF16(const float* a, const float* r, size_t n) {
  return AsAssertion(CompareBF16(a, r, n), a, r);
}

}  // namespace kda::testing
