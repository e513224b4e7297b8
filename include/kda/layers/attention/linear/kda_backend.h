// KDAAttnBackend (layers/attention/linear/kda_backend.cc): the attention
// backend of the KDA layers, a LinearRecurrentAttnBackend that binds the KDA
// kernels through the dispatcher: the per-key-dim gate and beta, then
// chunk_kda (prefill) or fused_recurrent_kda (decode, and the several tokens
// per sequence of a verify step and its commit) on the pool's states in place
// (no gather or scatter). One backend instance serves every KDA layer of
// a model.
#pragma once

#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/mem_cache/memory_pools.h"

namespace kda {

class KDAAttnBackend : public LinearRecurrentAttnBackend {
 public:
  KDAAttnBackend(MemoryPools pools, KernelImpl kernel = KernelImpl::kAuto);
  KernelImpl kernel() const { return kernel_; }

 protected:
  void RunExtend(const CoreStep& step) override;
  void RunDecode(const CoreStep& step) override;
  void RunVerify(const CoreStep& step) override;
  void RunCommit(const CoreStep& step) override;

 private:
  // The observer's kGateRaw, kGate and kBeta of a step.
  void ReportGate(const CoreStep& s, const float* g, const float* beta) const;

  KernelImpl kernel_;
};

}  // namespace kda
