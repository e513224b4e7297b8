#include "kda/base/tolerance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace kda {

std::string ToleranceReport::Summary() const {
  std::ostringstream s;
  if (!bf16) {
    s << "max err/tol " << max_ratio << ", relL2 " << rel_l2 << ", " << outside << " outside";
    if (outside > 0) s << " (first at " << first_bad << ")";
    return s.str();
  }
  // Each quantity with its limit, in the order of the rule.
  s << "rule/limit " << max_ratio << ": vs ref relL2 " << rel_l2 << " (<= 2e-3), " << outside << " of " << n
    << " outside tol(r) (<= 0.5%";
  if (outside > 0) s << ", first at " << first_bad;
  s << "), max err/tol(r) " << max_tol_ratio << "; vs exact relL2 " << rel_l2_ax << " (ref " << rel_l2_rx
    << ", <= 1.1x), max err/tol(x) " << max_ax << " at " << worst_ax << " (ref " << max_rx << ", <= 1.5x)";
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

// num / limit, where a zero limit passes only a zero numerator.
double RatioToLimit(double num, double limit) {
  if (std::isnan(num)) return INFINITY;
  if (limit > 0) return num / limit;
  return num > 0 ? INFINITY : 0.0;
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

ToleranceReport CompareStateF32(const float* a, const float* r, size_t n) {
  double max_abs = 0.0;
  for (size_t i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(static_cast<double>(r[i])));
  return CompareF32(a, r, n, 1e-5 * std::max(1.0, max_abs), 1e-5);
}

double UlpBF16(double m) {
  if (m == 0.0 || !std::isfinite(m)) return 0.0;
  return std::ldexp(1.0, std::ilogb(m) - 7);
}

ToleranceReport CompareBF16(const float* a, const float* r, const float* x, size_t n) {
  ToleranceReport rep;
  rep.bf16 = true;
  rep.n = n;
  double ar2 = 0.0;  // ||a - r||^2
  double r2 = 0.0;
  double ax2 = 0.0;
  double rx2 = 0.0;
  double x2 = 0.0;
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    const double av = a[i];
    const double rv = r[i];
    const double xv = x[i];
    nan = nan || std::isnan(av);
    const double u = UlpBF16(std::max(std::fabs(av), std::fabs(rv)));
    const double tol_r = 1e-3 + 1e-3 * std::fabs(rv) + u;
    const double tol_x = 1e-3 + 1e-3 * std::fabs(xv) + u;
    const double d_ar = std::fabs(av - rv);
    const double d_ax = std::fabs(av - xv);
    const double d_rx = std::fabs(rv - xv);
    if (!(d_ar <= tol_r)) {  // NaN fails too
      if (rep.outside == 0) rep.first_bad = i;
      ++rep.outside;
    }
    rep.max_tol_ratio = std::max(rep.max_tol_ratio, std::isnan(d_ar) ? INFINITY : d_ar / tol_r);
    const double ax_ratio = std::isnan(d_ax) ? INFINITY : d_ax / tol_x;
    if (ax_ratio > rep.max_ax || i == 0) {
      rep.max_ax = ax_ratio;
      rep.worst_ax = i;
    }
    rep.max_rx = std::max(rep.max_rx, d_rx / tol_x);
    ar2 += d_ar * d_ar;
    r2 += rv * rv;
    ax2 += d_ax * d_ax;
    rx2 += d_rx * d_rx;
    x2 += xv * xv;
  }
  rep.rel_l2 = r2 > 0 ? std::sqrt(ar2 / r2) : std::sqrt(ar2);
  rep.rel_l2_ax = x2 > 0 ? std::sqrt(ax2 / x2) : std::sqrt(ax2);
  rep.rel_l2_rx = x2 > 0 ? std::sqrt(rx2 / x2) : std::sqrt(rx2);
  const double outside_share = n > 0 ? static_cast<double>(rep.outside) / static_cast<double>(n) : 0.0;
  rep.max_ratio =
      std::max({RatioToLimit(rep.rel_l2, 2e-3), RatioToLimit(outside_share, 5e-3),
                RatioToLimit(rep.rel_l2_ax, 1.1 * rep.rel_l2_rx), RatioToLimit(rep.max_ax, 1.5 * rep.max_rx)});
  rep.ok = !nan && rep.max_ratio <= 1.0;
  if (nan) rep.max_ratio = std::numeric_limits<double>::infinity();
  return rep;
}

}  // namespace kda
