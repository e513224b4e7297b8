// KDAAttnBackend (layers/attention/linear/kda_backend.cc): the attention
// backend of the KDA layers, a LinearRecurrentAttnBackend that binds the KDA
// kernels through the dispatcher. Both prefill and decode read and write the
// recurrent states in place in the pool's slots (no gather or scatter). One
// backend instance serves every KDA layer of a model.
#pragma once

#include "kda/base/dtype.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/attention/linear/linear_recurrent_backend.h"
#include "kda/mem_cache/memory_pools.h"

namespace kda {

class RadixLinearAttention;

class KDAAttnBackend : public LinearRecurrentAttnBackend {
 public:
  KDAAttnBackend(MemoryPools pools, KernelImpl kernel = KernelImpl::kAuto);
  KernelImpl kernel() const { return kernel_; }

 protected:
  void ForwardExtend(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                     ConstBuf beta_logits) override;
  void ForwardDecode(const RadixLinearAttention& layer, MutBuf o, ConstBuf mixed_qkv, ConstBuf gate_raw,
                     ConstBuf beta_logits) override;

 private:
  // Conv + SiLU, then the gate g [T, H, K] and beta [T, H] in fp32.
  struct Inputs;
  void Prepare(const RadixLinearAttention& layer, ConstBuf mixed_qkv, ConstBuf gate_raw, ConstBuf beta_logits,
               Inputs& in);

  KernelImpl kernel_;
};

}  // namespace kda
