#include <cmath>

#include "kda/kernels/kda_gate.h"
#include "kernels/isa/constants.h"

namespace kda {

float KdaGate(float raw_plus_bias, float a_log) {
  // softplus(x) = x for x > 20 (log1p(exp(x)) equals x to fp32 precision there and exp would grow needlessly).
  const float softplus = raw_plus_bias > kc::kSoftplusThreshold ? raw_plus_bias : std::log1p(std::exp(raw_plus_bias));
  return -std::exp(a_log) * softplus;
}

float KdaLowerBoundGate(float raw_plus_bias, float a, float lower_bound) {
  return lower_bound / (1.0F + std::exp(-(a * raw_plus_bias)));
}

}  // namespace kda
