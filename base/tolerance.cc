#include "kda/base/tolerance.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kda {

std::string ToleranceReport::Summary() const {
  std::ostringstream s;
  s << "max err/tol " << max_ratio << ", relL2 " << rel_l2 << ", " << outside << " outside";
  if (outside > 0) s << " (first at " << first_bad << ")";
  return s.str();
}

namespace {

void Accumulate(ToleranceReport& r, size_t i, double d, double tol) {
  const double ratio = std::isnan(d) ? INFINITY : d / tol;
  r.max_ratio = std::max(r.max_ratio, ratio);
  if (!(d <= tol)) {  // NaN fails too
    if (r.outside == 0) r.first_bad = i;
    ++r.outside;
  }
}

}  // namespace

ToleranceReport CompareF32(const float* a, const float* r, size_t n, double atol, double rtol) {
  ToleranceReport rep;
  double num = 0.0;
  double den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - r[i]);
    Accumulate(rep, i, d, atol + rtol * std::fabs(static_cast<double>(r[i])));
    num += d * d;
    den += static_cast<double>(r[i]) * r[i];
  }
  rep.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  rep.ok = rep.outside == 0;
  return rep;
}

double UlpBF16(double m) {
  if (m == 0.0 || !std::isfinite(m)) return 0.0;
  return std::ldexp(1.0, std::ilogb(m) - 7);
}

ToleranceReport CompareBF16(const float* a, const float* r, size_t n) {
  ToleranceReport rep;
  size_t loose = 0;
  double num = 0.0;
  double den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double av = a[i];
    const double rv = r[i];
    const double d = std::fabs(av - rv);
    const double u = UlpBF16(std::max(std::fabs(av), std::fabs(rv)));
    if (!(d <= 1e-3 + 1e-3 * std::fabs(rv) + u)) ++loose;
    Accumulate(rep, i, d, 2e-3 + 2e-3 * std::fabs(rv) + u);
    num += (av - rv) * (av - rv);
    den += rv * rv;
  }
  rep.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  rep.ok = rep.outside == 0 && static_cast<double>(loose) <= 1e-3 * static_cast<double>(n) && rep.rel_l2 <= 2e-3;
  if (!rep.ok) rep.max_ratio = std::max(rep.max_ratio, rep.rel_l2 / 2e-3);
  return rep;
}

}  // namespace kda
