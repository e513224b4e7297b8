// The element-wise kernels: plain references, validation, and the host side
// of the optimized versions (jobs over threads); their compute code is
// gate_beta_simd.cc, gated_rms_norm_simd.cc and residual_add_simd.cc, compiled per
// instruction set and reached through the dispatch table.
#include "kda/kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/kernels/kda_gate.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/dispatch.h"

namespace kda {
namespace {

using kc::kRowsPerJob;

void CheckFloatBuf(DType t, const char* what) {
  Check(t == DType::kF32 || t == DType::kBF16, std::string(what) + " must be F32 or BF16");
}

void CheckGateActivation(GateActivation act) {
  Check(act == GateActivation::kSigmoid || act == GateActivation::kSilu,
        "gated RMSNorm: unknown gate activation " + std::to_string(static_cast<int>(act)));
}

// Mamba2's gated RMSNorm's inputs; kda::Error naming the first bad one.
void CheckGroupsInputs(ConstBuf o, ConstBuf z, int64_t T, int groups, int64_t width, SsdNorm form) {
  CheckFloatBuf(o.dtype, "grouped RMSNorm input");
  Check(z.dtype == o.dtype, "grouped RMSNorm: input, gate and output must share a dtype");
  Check(T >= 0, "grouped RMSNorm: T must be >= 0, got " + std::to_string(T));
  Check(groups > 0, "grouped RMSNorm: groups must be positive, got " + std::to_string(groups));
  Check(width > 0, "grouped RMSNorm: width must be positive, got " + std::to_string(width));
  Check(form == SsdNorm::kGateThenNorm || form == SsdNorm::kNormThenGate || form == SsdNorm::kGateOnly,
        "grouped RMSNorm: unknown form " + std::to_string(static_cast<int>(form)));
  if (T == 0) return;  // nothing is read or written
  Check(o.data != nullptr, "grouped RMSNorm: input o is null");
  Check(z.data != nullptr, "grouped RMSNorm: gate z is null");
}

// Mamba2's gated RMSNorm's arguments; kda::Error naming the first bad one.
void CheckGatedRmsNormGroups(MutBuf y, ConstBuf o, ConstBuf z, const float* w, int64_t T, int groups, int64_t width,
                             SsdNorm form) {
  CheckFloatBuf(y.dtype, "grouped RMSNorm output");
  Check(o.dtype == y.dtype && z.dtype == y.dtype, "grouped RMSNorm: input, gate and output must share a dtype");
  CheckGroupsInputs(o, z, T, groups, width, form);
  if (T == 0) return;
  Check(y.data != nullptr, "grouped RMSNorm: output y is null");
  Check(w != nullptr || form == SsdNorm::kGateOnly, "grouped RMSNorm: weight w is null");
}

}  // namespace

void KdaGateBetaReference(float* g, float* beta, ConstBuf raw, ConstBuf logits, const float* A_log,
                          const float* dt_bias, int64_t T, int H, int K, GateForm form) {
  const int64_t p = static_cast<int64_t>(H) * K;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < p; ++c) {
      const float x = LoadAsFloat(raw.data, raw.dtype, static_cast<size_t>(t * p + c)) + dt_bias[c];
      g[t * p + c] = form.lower_bound < 0.0F ? KdaLowerBoundGate(x, std::exp(A_log[c / K]), form.lower_bound)
                                             : KdaGate(x, A_log[c / K]);
    }
    for (int h = 0; h < H; ++h) {
      const float x = LoadAsFloat(logits.data, logits.dtype, static_cast<size_t>(t * H + h));
      beta[t * H + h] = form.beta_scale / (1.0F + std::exp(-x));
    }
  }
}

void KdaGateBeta(float* g, float* beta, ConstBuf raw, ConstBuf logits, const float* A_log, const float* dt_bias,
                 int64_t T, int H, int K, GateForm form) {
  CheckFloatBuf(raw.dtype, "gate input");
  Check(raw.dtype == logits.dtype, "gate and beta inputs must share a dtype");
  Check(std::isfinite(form.lower_bound) && form.lower_bound <= 0.0F, "gate: lower_bound must be finite and <= 0");
  Check(std::isfinite(form.beta_scale), "gate: beta_scale must be finite");
  // Per head: -exp(A_log) for the softplus gate, exp(A_log) for the lower-bound gate.
  const bool bounded = form.lower_bound < 0.0F;
  std::vector<float> a(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) a[h] = bounded ? std::exp(A_log[h]) : -std::exp(A_log[h]);
  const internal::KernelTable& kernels = internal::ActiveKernels();
  ParallelFor((T + kRowsPerJob - 1) / kRowsPerJob, [&](int64_t job) {
    const int64_t t0 = job * kRowsPerJob;
    const int64_t t1 = std::min(T, t0 + kRowsPerJob);
    if (raw.dtype == DType::kBF16) {
      kernels.gate_beta_bf16(g, beta, static_cast<const BF16*>(raw.data), static_cast<const BF16*>(logits.data),
                             a.data(), dt_bias, t0, t1, H, K, form.lower_bound, form.beta_scale);
    } else {
      kernels.gate_beta_f32(g, beta, static_cast<const float*>(raw.data), static_cast<const float*>(logits.data),
                            a.data(), dt_bias, t0, t1, H, K, form.lower_bound, form.beta_scale);
    }
  });
}

void SsdGateDt(float* g, float* dt, ConstBuf raw, const float* A_log, const float* dt_bias, int64_t T, int H,
               float dt_min, float dt_max) {
  CheckFloatBuf(raw.dtype, "dt input");
  std::vector<float> a(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) a[h] = -std::exp(A_log[h]);
  ParallelFor((T + kRowsPerJob - 1) / kRowsPerJob, [&](int64_t job) {
    const int64_t t1 = std::min(T, (job + 1) * kRowsPerJob);
    for (int64_t i = job * kRowsPerJob * H; i < t1 * H; ++i) {
      const int h = static_cast<int>(i % H);
      const float x = LoadAsFloat(raw.data, raw.dtype, static_cast<size_t>(i)) + dt_bias[h];
      const float d = std::min(std::max(x > 20.0F ? x : std::log1p(std::exp(x)), dt_min), dt_max);
      dt[i] = d;
      g[i] = a[h] * d;
    }
  });
}

void KdaGateRowInPlace(float* g, const float* bias, float A_log, int len) {
  internal::ActiveKernels().gate_row(g, bias, -std::exp(A_log), len);
}

const char* SsdNormName(SsdNorm form) {
  switch (form) {
    case SsdNorm::kGateThenNorm:
      return "gate_then_norm";
    case SsdNorm::kNormThenGate:
      return "norm_then_gate";
    case SsdNorm::kGateOnly:
      return "gate_only";
  }
  return "unknown";
}

const char* GateActivationName(GateActivation act) {
  switch (act) {
    case GateActivation::kSigmoid:
      return "sigmoid";
    case GateActivation::kSilu:
      return "silu";
  }
  return "unknown";
}

void GatedRmsNormReference(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps,
                           GateActivation act) {
  CheckGateActivation(act);
  for (int64_t r = 0; r < T * H; ++r) {
    float ss = 0.0F;
    for (int d = 0; d < V; ++d) {
      const float v = LoadAsFloat(o.data, o.dtype, static_cast<size_t>(r * V + d));
      ss += v * v;
    }
    const float rstd = 1.0F / std::sqrt(ss / static_cast<float>(V) + eps);
    for (int d = 0; d < V; ++d) {
      const auto i = static_cast<size_t>(r * V + d);
      const float gv = LoadAsFloat(gate.data, gate.dtype, i);
      const float ov = LoadAsFloat(o.data, o.dtype, i);
      const float yv = act == GateActivation::kSilu ? ov * rstd * w[d] * (gv * (1.0F / (1.0F + std::exp(-gv))))
                                                    : ov * rstd * w[d] / (1.0F + std::exp(-gv));
      StoreFromFloat(y.data, y.dtype, i, yv);
    }
  }
}

void GatedRmsNorm(MutBuf y, ConstBuf o, ConstBuf gate, const float* w, int64_t T, int H, int V, float eps,
                  GateActivation act) {
  CheckFloatBuf(y.dtype, "RMSNorm output");
  Check(o.dtype == y.dtype && gate.dtype == y.dtype, "RMSNorm input, gate and output must share a dtype");
  CheckGateActivation(act);
  const int64_t rows = T * H;
  const internal::KernelTable& kernels = internal::ActiveKernels();
  const auto rms_norm_bf16 = kernels.rms_norm_bf16[static_cast<int>(act)];
  const auto rms_norm_f32 = kernels.rms_norm_f32[static_cast<int>(act)];
  ParallelFor((rows + kRowsPerJob * 4 - 1) / (kRowsPerJob * 4), [&](int64_t job) {
    const int64_t r0 = job * kRowsPerJob * 4;
    const int64_t r1 = std::min(rows, r0 + kRowsPerJob * 4);
    if (y.dtype == DType::kBF16) {
      rms_norm_bf16(static_cast<BF16*>(y.data), static_cast<const BF16*>(o.data), static_cast<const BF16*>(gate.data),
                    w, r0, r1, V, eps);
    } else {
      rms_norm_f32(static_cast<float*>(y.data), static_cast<const float*>(o.data), static_cast<const float*>(gate.data),
                   w, r0, r1, V, eps);
    }
  });
}

void GatedRmsNormGroupsSquares(float* ss, ConstBuf o, ConstBuf z, int64_t T, int groups, int64_t width, SsdNorm form) {
  CheckGroupsInputs(o, z, T, groups, width, form);
  Check(T == 0 || ss != nullptr, "grouped RMSNorm: sums of squares ss is null");
  ParallelFor(T, [&](int64_t t) {
    for (int64_t r = t * groups; r < (t + 1) * groups; ++r) {  // r = t * groups + j
      float sum = 0.0F;
      for (int64_t c = 0; c < width && form != SsdNorm::kGateOnly; ++c) {
        const auto i = static_cast<size_t>(r * width + c);
        const float zv = LoadAsFloat(z.data, z.dtype, i);
        const float ov = LoadAsFloat(o.data, o.dtype, i);
        const float sq = form == SsdNorm::kNormThenGate ? ov : ov * (zv * (1.0F / (1.0F + std::exp(-zv))));
        sum += sq * sq;
      }
      ss[r] = sum;
    }
  });
}

void GatedRmsNormGroupsFromSquares(MutBuf y, ConstBuf o, ConstBuf z, const float* w, const float* ss, int64_t count,
                                   int64_t T, int groups, int64_t width, float eps, SsdNorm form) {
  CheckGatedRmsNormGroups(y, o, z, w, T, groups, width, form);
  Check(count >= width,
        "grouped RMSNorm: the channel count " + std::to_string(count) + " is below the width " + std::to_string(width));
  Check(T == 0 || ss != nullptr, "grouped RMSNorm: sums of squares ss is null");
  ParallelFor(T, [&](int64_t t) {
    for (int64_t r = t * groups; r < (t + 1) * groups; ++r) {
      const float rstd = 1.0F / std::sqrt(ss[r] / static_cast<float>(count) + eps);
      for (int64_t c = 0; c < width; ++c) {
        const auto i = static_cast<size_t>(r * width + c);
        const float zv = LoadAsFloat(z.data, z.dtype, i);
        const float ov = LoadAsFloat(o.data, o.dtype, i);
        const float gate = zv * (1.0F / (1.0F + std::exp(-zv)));
        float v = ov * gate;
        if (form == SsdNorm::kGateThenNorm) v = v * rstd * w[(r % groups) * width + c];
        if (form == SsdNorm::kNormThenGate) v = ov * rstd * w[(r % groups) * width + c] * gate;
        StoreFromFloat(y.data, y.dtype, i, v);
      }
    }
  });
}

void GatedRmsNormGroupsReference(MutBuf y, ConstBuf o, ConstBuf z, const float* w, int64_t T, int groups, int64_t width,
                                 float eps, SsdNorm form) {
  CheckGatedRmsNormGroups(y, o, z, w, T, groups, width, form);
  std::vector<float> ss(static_cast<size_t>(T * groups));
  GatedRmsNormGroupsSquares(ss.data(), o, z, T, groups, width, form);
  GatedRmsNormGroupsFromSquares(y, o, z, w, ss.data(), width, T, groups, width, eps, form);
}

void GatedRmsNormGroups(MutBuf y, ConstBuf o, ConstBuf z, const float* w, int64_t T, int groups, int64_t width,
                        float eps, SsdNorm form) {
  CheckGatedRmsNormGroups(y, o, z, w, T, groups, width, form);
  const int64_t rows = T * groups;
  if (rows == 0) return;
  // Each worker a contiguous range of rows and its own scratch row g (whole cache lines apart); kept per
  // calling thread, so that decode steps allocate nothing.
  const int64_t per_worker_rows = std::max<int64_t>(1, kc::kNormGroupsMinPerWorker / width);
  const int64_t num_workers =
      std::min<int64_t>(std::max(1, NumThreads()), (rows + per_worker_rows - 1) / per_worker_rows);
  const int64_t stride = (width + 15) / 16 * 16;
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(num_workers * stride)) {
    scratch.resize(static_cast<size_t>(num_workers * stride));
  }
  float* const scratch_base = scratch.data();  // the workers' threads see their own (empty) thread_local
  const internal::KernelTable& kernels = internal::ActiveKernels();
  ParallelFor(num_workers, [&](int64_t worker) {
    const int64_t r0 = rows * worker / num_workers;
    const int64_t r1 = rows * (worker + 1) / num_workers;
    float* const g = scratch_base + worker * stride;
    if (y.dtype == DType::kBF16) {
      kernels.rms_norm_groups_bf16[static_cast<int>(form)](static_cast<BF16*>(y.data), static_cast<const BF16*>(o.data),
                                                           static_cast<const BF16*>(z.data), w, r0, r1, groups, width,
                                                           eps, g);
    } else {
      kernels.rms_norm_groups_f32[static_cast<int>(form)](
          static_cast<float*>(y.data), static_cast<const float*>(o.data), static_cast<const float*>(z.data), w, r0, r1,
          groups, width, eps, g);
    }
  });
}

void AddInPlaceReference(MutBuf acc, ConstBuf x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const auto j = static_cast<size_t>(i);
    StoreFromFloat(acc.data, acc.dtype, j, LoadAsFloat(acc.data, acc.dtype, j) + LoadAsFloat(x.data, x.dtype, j));
  }
}

void AddInPlace(MutBuf acc, ConstBuf x, int64_t n) {
  CheckFloatBuf(acc.dtype, "residual sum");
  Check(x.dtype == acc.dtype, "residual add: the addend and the sum must share a dtype");
  constexpr int64_t kPerJob = kc::kAddPerJob;  // elements: memory-bound, big jobs
  const internal::KernelTable& kernels = internal::ActiveKernels();
  ParallelFor((n + kPerJob - 1) / kPerJob, [&](int64_t job) {
    const int64_t i0 = job * kPerJob;
    const int64_t i1 = std::min(n, i0 + kPerJob);
    if (acc.dtype == DType::kBF16) {
      kernels.add_bf16(static_cast<BF16*>(acc.data), static_cast<const BF16*>(x.data), i0, i1);
    } else {
      kernels.add_f32(static_cast<float*>(acc.data), static_cast<const float*>(x.data), i0, i1);
    }
  });
}

void ConvertToBF16Reference(BF16* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ToBF16(x[i]);
}

void ConvertToFloatReference(float* y, const BF16* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ToFloat(x[i]);
}

void ConvertToBF16(BF16* y, const float* x, int64_t n) {
  const internal::KernelTable& kernels = internal::ActiveKernels();
  ParallelFor((n + kc::kAddPerJob - 1) / kc::kAddPerJob, [&](int64_t job) {
    kernels.to_bf16(y, x, job * kc::kAddPerJob, std::min(n, (job + 1) * kc::kAddPerJob));
  });
}

void ConvertToFloat(float* y, const BF16* x, int64_t n) {
  const internal::KernelTable& kernels = internal::ActiveKernels();
  ParallelFor((n + kc::kAddPerJob - 1) / kc::kAddPerJob, [&](int64_t job) {
    kernels.to_f32(y, x, job * kc::kAddPerJob, std::min(n, (job + 1) * kc::kAddPerJob));
  });
}

}  // namespace kda
