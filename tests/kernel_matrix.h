// The kernel test matrix: every kernel runs as its plain reference and as its
// optimized version in every instruction-set variant this CPU supports.
// Parameterised suites instantiate over AllVariants() and name each case
// impl_isa ("reference", "optimized_generic", "optimized_avx2",
// "optimized_avx512", "optimized_avx512_shape"); a VariantScope forces the variant's ISA while a case runs.
// The oracle every KDA kernel of the matrix meets: NaiveRecurrenceF64, the recurrence in float64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/kda/kda_dispatch_testing.h"
#include "tests/kda_problem.h"

namespace kda::testing {

struct Variant {
  KernelImpl impl = KernelImpl::kReference;
  KernelIsa isa = KernelIsa::kAuto;  // the optimized kernels' ISA; kAuto for the reference
  bool optimized() const { return impl == KernelImpl::kOptimized; }
};

// Every ISA variant (kAuto aside), supported here or not.
inline std::vector<KernelIsa> AllIsas() {
  return {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512, KernelIsa::kAvx512Shape};
}

// The ISA variants this CPU supports.
inline std::vector<KernelIsa> SupportedIsas() {
  std::vector<KernelIsa> r;
  for (KernelIsa isa : AllIsas()) {
    if (CpuSupportsKernelIsa(isa)) r.push_back(isa);
  }
  return r;
}

// The reference, then the optimized kernels in every supported ISA.
inline std::vector<Variant> AllVariants() {
  std::vector<Variant> r = {{KernelImpl::kReference, KernelIsa::kAuto}};
  for (KernelIsa isa : SupportedIsas()) r.push_back({KernelImpl::kOptimized, isa});
  return r;
}

// The optimized kernels in every supported ISA.
inline std::vector<Variant> OptimizedVariants() {
  std::vector<Variant> r;
  for (KernelIsa isa : SupportedIsas()) r.push_back({KernelImpl::kOptimized, isa});
  return r;
}

inline std::string VariantName(const Variant& v) {
  return v.optimized() ? std::string("optimized_") + KernelIsaName(v.isa) : "reference";
}

// gtest prints parameters with this (ctest names carry it).
inline void PrintTo(const Variant& v, std::ostream* os) { *os << VariantName(v); }

// Forces the variant's ISA (optimized) for the scope; back to auto after.
class VariantScope {
 public:
  explicit VariantScope(const Variant& v) {
    if (v.optimized()) SetKernelIsa(v.isa);
  }
  ~VariantScope() { internal::ResetKernelIsaForTesting(); }
  VariantScope(const VariantScope&) = delete;
  VariantScope& operator=(const VariantScope&) = delete;
};

// A fixture over the variants: the variant's ISA is forced for the whole case.
class VariantTest : public ::testing::TestWithParam<Variant> {
 protected:
  const Variant& variant() const { return GetParam(); }
  // The variant's kernel of two with the same parameters: `optimized` for an optimized variant, else `reference`.
  template <class Fn>
  Fn Pick(Fn optimized, Fn reference) const {
    return variant().optimized() ? optimized : reference;
  }

 private:
  VariantScope scope_{GetParam()};
};

struct VariantParamName {
  std::string operator()(const ::testing::TestParamInfo<Variant>& info) const { return VariantName(info.param); }
};

// The recurrence of design §2 in double, written independently of all the
// kernels, with every option of the problem (the in-kernel L2 norm and gates,
// dt_bias absent when empty, beta logits and per-value beta, grouped value
// heads, V-first states). p.h0 [N, HV, K, V] is each sequence's initial state
// (empty: zeros); the result's state is each sequence's state after its last
// token (its initial state when empty). With `chunk_states`: the state before
// every chunk_size-th token of each sequence, its chunks one after the other
// ([NT, HV, K, V]). With `token_states`: the state after every token t, row t
// ([T, HV, K, V]). Every state in p's layout (V-first with state_v_first).
inline Result NaiveRecurrenceF64(const Problem& p, int chunk_size = 64, std::vector<float>* chunk_states = nullptr,
                                 std::vector<float>* token_states = nullptr) {
  const int kd = p.K;
  const int vd = p.V;
  const int group = p.HV / p.H;
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(kd));
  const auto state_at = [&](int d, int j) {
    return p.state_v_first ? static_cast<size_t>(j) * kd + d : static_cast<size_t>(d) * vd + j;
  };
  Result r;
  r.o.assign(static_cast<size_t>(p.T) * p.ValueRow(), 0.0F);
  r.state.assign(p.StateSize(), 0.0F);
  std::vector<int64_t> first_chunk(static_cast<size_t>(p.N) + 1, 0);
  for (int64_t n = 0; chunk_states != nullptr && n < p.N; ++n) {
    first_chunk[n + 1] = first_chunk[n] + (p.cu[n + 1] - p.cu[n] + chunk_size - 1) / chunk_size;
  }
  if (chunk_states != nullptr) {
    chunk_states->assign(static_cast<size_t>(first_chunk[p.N]) * p.HV * p.HeadState(), 0.0F);
  }
  if (token_states != nullptr) token_states->assign(static_cast<size_t>(p.T) * p.HV * p.HeadState(), 0.0F);
  // s ([K][V] in double) into dst in p's layout.
  const auto store = [&](const std::vector<double>& s, float* dst) {
    for (int d = 0; d < kd; ++d) {
      for (int j = 0; j < vd; ++j) dst[state_at(d, j)] = static_cast<float>(s[static_cast<size_t>(d) * vd + j]);
    }
  };
  for (int64_t n = 0; n < p.N; ++n) {
    for (int h = 0; h < p.HV; ++h) {
      const size_t soff = (static_cast<size_t>(n) * p.HV + h) * p.HeadState();
      std::vector<double> s(p.HeadState(), 0.0);  // [K][V]
      if (!p.h0.empty()) {
        for (int d = 0; d < kd; ++d) {
          for (int j = 0; j < vd; ++j) s[static_cast<size_t>(d) * vd + j] = p.h0[soff + state_at(d, j)];
        }
      }
      for (int64_t t = p.cu[n]; t < p.cu[n + 1]; ++t) {
        if (chunk_states != nullptr && (t - p.cu[n]) % chunk_size == 0) {
          const int64_t chunk = first_chunk[n] + (t - p.cu[n]) / chunk_size;
          store(s, chunk_states->data() + (static_cast<size_t>(chunk) * p.HV + h) * p.HeadState());
        }
        const size_t key_row = (static_cast<size_t>(t) * p.H + h / group) * kd;
        const int gw = p.GateWidth();  // g: a value per key dimension, or one per value head
        const size_t gate_row = (static_cast<size_t>(t) * p.HV + h) * gw;
        const size_t value_row = (static_cast<size_t>(t) * p.HV + h) * vd;
        std::vector<double> q(p.q.begin() + key_row, p.q.begin() + key_row + kd);
        std::vector<double> k(p.k.begin() + key_row, p.k.begin() + key_row + kd);
        double qq = 0.0, kk = 0.0;
        for (int d = 0; d < kd; ++d) qq += q[d] * q[d], kk += k[d] * k[d];
        for (int d = 0; d < kd; ++d) {
          if (p.l2norm_in_kernel) q[d] /= std::sqrt(qq + 1e-6), k[d] /= std::sqrt(kk + 1e-6);
          q[d] *= scale;
        }
        std::vector<double> beta(vd);
        for (int j = 0; j < vd; ++j) {
          double b = p.beta_per_value ? p.beta[value_row + j] : p.beta[static_cast<size_t>(t) * p.HV + h];
          if (p.beta_sigmoid) b = (p.allow_neg_eigval ? 2.0 : 1.0) / (1.0 + std::exp(-b));
          beta[j] = b;
        }
        for (int d = 0; d < kd; ++d) {
          const int gd = p.scalar_gate ? 0 : d;
          double g = p.g[gate_row + gd];
          if (p.gate_in_kernel) {
            const double x = g + (p.dt_bias.empty() ? 0.0 : p.dt_bias[static_cast<size_t>(h) * gw + gd]);
            if (p.lower_bound < 0.0F) {
              const double a = p.a_log.empty() ? 1.0 : std::exp(static_cast<double>(p.a_log[h]));
              g = p.lower_bound / (1.0 + std::exp(-a * x));
            } else {
              g = -std::exp(static_cast<double>(p.a_log[h])) * (x > 20 ? x : std::log1p(std::exp(x)));
            }
          }
          for (int j = 0; j < vd; ++j) s[static_cast<size_t>(d) * vd + j] *= std::exp(g);
        }
        for (int j = 0; j < vd; ++j) {
          double kv = 0.0;
          for (int d = 0; d < kd; ++d) kv += k[d] * s[static_cast<size_t>(d) * vd + j];
          const double delta = beta[j] * (p.v[value_row + j] - (p.delta_correction ? kv : 0.0));
          double o = 0.0;
          for (int d = 0; d < kd; ++d) {
            s[static_cast<size_t>(d) * vd + j] += k[d] * delta;
            o += q[d] * s[static_cast<size_t>(d) * vd + j];
          }
          if (!p.d.empty()) o += static_cast<double>(p.d[h]) * p.v[value_row + j];  // Mamba2's skip
          r.o[value_row + j] = static_cast<float>(o);
        }
        if (token_states != nullptr) {
          store(s, token_states->data() + (static_cast<size_t>(t) * p.HV + h) * p.HeadState());
        }
      }
      store(s, r.state.data() + soff);
    }
  }
  return r;
}

}  // namespace kda::testing
