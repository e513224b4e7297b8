// The tolerance rules of design §5 as gtest assertions.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kda/base/bf16.h"
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

// fp32 rule for final states (design §5): 1e-5 max(1, max|r|) + 1e-5 |r|.
inline ::testing::AssertionResult AllCloseStateF32(const float* a, const float* r, size_t n) {
  return AsAssertion(CompareStateF32(a, r, n), a, r);
}

// bf16 rule v2 of design §5: a the tested bf16 pipeline, r the reference bf16
// pipeline, x the exact output. A failure names the worst element against x.
inline ::testing::AssertionResult AllCloseBF16(const float* a, const float* r, const float* x, size_t n) {
  const ToleranceReport rep = CompareBF16(a, r, x, n);
  auto res = AsAssertion(rep, a, r);
  if (!rep.ok && n > 0) {
    const size_t i = rep.worst_ax;
    res << "; worst vs exact at " << i << ": got " << a[i] << " ref " << r[i] << " exact " << x[i];
  }
  return res;
}

// v rounded to bf16 once: the reference bf16 pipeline's value where its only
// cast point after an exact value is one rounding (e.g. the conv tail).
inline std::vector<float> RoundedBF16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = RoundBF16(v[i]);
  return r;
}

}  // namespace kda::testing
