// The tolerance rules of design §5, shared by the tests and the CLI's
// self-checks.
#pragma once

#include <cstddef>
#include <string>

namespace kda {

struct ToleranceReport {
  bool ok = true;
  // How far the worst quantity of the rule is from its limit; <= 1 passes.
  // fp32: max over elements of |a - r| / tolerance. bf16: the largest of the
  // rule's four ratios to their limits (see CompareBF16).
  double max_ratio = 0.0;
  double rel_l2 = 0.0;   // ||a - r|| / ||r||
  size_t outside = 0;    // elements outside the per-element band (fp32: tolerance; bf16: tol(r))
  size_t first_bad = 0;  // index of the first element outside that band (if any)

  // bf16 rule only (CompareBF16; bf16 == true).
  bool bf16 = false;
  size_t n = 0;                // elements compared
  double max_tol_ratio = 0.0;  // max |a - r| / tol(r): no limit, shown for diagnosis
  double rel_l2_ax = 0.0;      // ||a - x|| / ||x||
  double rel_l2_rx = 0.0;      // ||r - x|| / ||x||
  double max_ax = 0.0;         // max |a - x| / tol(x)
  double max_rx = 0.0;         // max |r - x| / tol(x)
  size_t worst_ax = 0;         // index of max_ax

  std::string Summary() const;
};

// fp32 rule: every element |a - r| <= atol + rtol |r|.
ToleranceReport CompareF32(const float* a, const float* r, size_t n, double atol = 1e-5, double rtol = 1e-5);

// fp32 rule for final states (recurrent and conv), whose entries grow with the
// activations: every element |a - r| <= 1e-5 max(1, max|r|) + 1e-5 |r|.
ToleranceReport CompareStateF32(const float* a, const float* r, size_t n);

// Spacing of bf16 numbers at magnitude m: 2^(floor(log2 m) - 7).
double UlpBF16(double m);

// bf16 rule v2 of design §5. a: the tested bf16 pipeline; r: the reference
// bf16 pipeline; x: the exact output (fp32 pipeline / float64). Per element
// u = UlpBF16(max(|a|, |r|)) and tol(v) = 1e-3 + 1e-3 |v| + u (tol(x) uses
// the same u, so a and r are measured against x with the same yardstick).
//  1. cast points there: ||a - r|| / ||r|| <= 2e-3 and at most 0.5% of
//     elements outside tol(r);
//  2. a no less accurate than r: ||a - x|| <= 1.1 ||r - x|| and
//     max |a - x| / tol(x) <= 1.5 max |r - x| / tol(x).
// Every quantity is reported; max_ratio is the worst of rel_l2 / 2e-3,
// outside share / 0.5%, rel_l2_ax / (1.1 rel_l2_rx) and
// max_ax / (1.5 max_rx). A NaN anywhere in a fails.
ToleranceReport CompareBF16(const float* a, const float* r, const float* x, size_t n);

}  // namespace kda
