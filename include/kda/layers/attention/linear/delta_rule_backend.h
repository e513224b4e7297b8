// DeltaRuleAttnBackend (layers/attention/linear/delta_rule_backend.cc): the
// attention backend of the delta-rule layers, KDA and Gated DeltaNet alike, a
// LinearRecurrentAttnBackend that runs the delta-rule kernels: the gate (one
// decay per key dimension or per value head, as the layer's geometry says) and
// beta, then the chunked kernel (prefill) or the recurrent one (decode, and
// the several tokens per sequence of a verify step and its commit) on the
// pool's states in place (no gather or scatter). Validated once, trusted
// after: the kernels' arguments are built from the layer's geometry (checked
// with the layer and the pool) and the step's metadata (checked by
// InitForwardMetadata), and run as they are (RunTrusted), not re-checked as
// the public calls are. One backend instance serves every layer of a model.
#pragma once

#include <cstdint>
#include <vector>

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
  std::vector<int64_t> decode_cu_;  // a decode step's sequence boundaries 0, 1, .., N
};

}  // namespace kda
