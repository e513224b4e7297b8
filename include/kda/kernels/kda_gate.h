// The KDA forget gate of one element, fp32 (kernels/kda/kda_gate.cc): what the
// kernels compute with use_gate_in_kernel and the layer's gate kernel.
#pragma once

namespace kda {

// The activated forget gate for one element (fp32): -exp(A_log) * softplus(raw + dt_bias).
float KdaGate(float raw_plus_bias, float a_log);

}  // namespace kda
