// The tolerance rules of design §5, shared by the tests and the CLI's
// self-checks.
#pragma once

#include <cstddef>
#include <string>

namespace kda {

struct ToleranceReport {
  bool ok = true;
  double max_ratio = 0.0;  // max over elements of |a - r| / tolerance (the strict band); <= 1 passes
  double rel_l2 = 0.0;     // ||a - r|| / ||r||
  size_t outside = 0;      // elements outside the strict band
  size_t first_bad = 0;    // index of the first element outside the strict band (if any)
  std::string Summary() const;
};

// fp32 rule: every element |a - r| <= atol + rtol |r|.
ToleranceReport CompareF32(const float* a, const float* r, size_t n, double atol = 1e-5, double rtol = 1e-5);

// Spacing of bf16 numbers at magnitude m: 2^(floor(log2 m) - 7).
double UlpBF16(double m);

// bf16 rule, with u = UlpBF16(max(|a|, |r|)): at least 99.9% of elements
// within 1e-3 + 1e-3|r| + u, every element within 2e-3 + 2e-3|r| + u, and
// ||a - r|| / ||r|| <= 2e-3. max_ratio is taken against the 2e-3 band.
ToleranceReport CompareBF16(const float* a, const float* r, size_t n);

}  // namespace kda
