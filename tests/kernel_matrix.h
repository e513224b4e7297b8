// The kernel test matrix: every kernel runs as its plain reference and as its
// optimized version in every instruction-set variant this CPU supports.
// Parameterised suites instantiate over AllVariants() and name each case
// impl_isa ("reference", "optimized_generic", "optimized_avx2",
// "optimized_avx512", "optimized_avx512_shape"); a VariantScope forces the variant's ISA while a case runs.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/kda/kda_dispatch_testing.h"

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

 private:
  VariantScope scope_{GetParam()};
};

struct VariantParamName {
  std::string operator()(const ::testing::TestParamInfo<Variant>& info) const { return VariantName(info.param); }
};

}  // namespace kda::testing
