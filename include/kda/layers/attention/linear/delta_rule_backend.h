// DeltaRuleAttnBackend (layers/attention/linear/delta_rule_backend.cc): the
// attention backend of the delta-rule layers, KDA and Gated DeltaNet alike, a
// LinearRecurrentAttnBackend that binds the delta-rule kernels through the
// dispatcher: the gate (one decay per key dimension or per value head, as the
// layer's geometry says) and beta, then chunk_kda (prefill) or
// fused_recurrent_kda (decode, and the several tokens per sequence of a
// verify step and its commit) on the pool's states in place (no gather or
// scatter). One backend instance serves every layer of a model.
#pragma once

#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/mem_cache/memory_pools.h"

namespace kda {

class DeltaRuleAttnBackend : public LinearRecurrentAttnBackend {
 public:
  DeltaRuleAttnBackend(MemoryPools pools, KernelImpl kernel = KernelImpl::kAuto);
  KernelImpl kernel() const { return kernel_; }

 protected:
  void RunExtend(const CoreStep& step) override;
  void RunDecode(const CoreStep& step) override;
  void RunVerify(const CoreStep& step) override;
  void RunCommit(const CoreStep& step) override;

 private:
  // The step's gate and beta computed and given to `run` (the kernel call),
  // then shown to the observer (kGateRaw, kGate, kBeta).
  template <class Run>
  void WithGate(const CoreStep& s, Run run) const;

  KernelImpl kernel_;
};

}  // namespace kda
