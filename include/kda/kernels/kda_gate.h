// The KDA forget gate of one element, fp32 (kernels/kda/kda_gate.cc): what the
// kernels compute with use_gate_in_kernel and the layer's gate kernel.
#pragma once

namespace kda {

// The activated forget gate for one element (fp32): -exp(A_log) * softplus(raw + dt_bias).
float KdaGate(float raw_plus_bias, float a_log);

// fla's sigmoid gate (lower_bound < 0): lower_bound * sigmoid(a * raw_plus_bias), a = exp(A_log) (or 1 without A_log).
float KdaLowerBoundGate(float raw_plus_bias, float a, float lower_bound);

}  // namespace kda
