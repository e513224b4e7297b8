// The recurrent-state pool that serving uses to keep one state per running
// request and delta-rule layer (design §4). The request -> slot map around it:
// memory_pools.h. It knows sizes (RecurrentStateSpec), not models.
//
// Per layer l: recurrent[l] [slots + 1, HV, K, V] fp32 and conv[l]
// [slots + 1, W-1, C] (C conv channels) in the model's activation dtype (bf16
// model: bf16 tails). Slot 0 is a dummy: never handed out, never written.
//
// A fresh request never sees a previous owner's state: every slot is zeroed
// in every layer when it is allocated (and the backend also starts sequences
// with has_initial_state == 0 from zero, whatever their slot holds).
//
// Speculative decoding (TARGET_VERIFY, docs/speculative.md): with a
// VerifyConfig of max_draft_tokens k, every slot also has a verify area per
// layer holding what a commit needs after a verify step of up to k + 1
// positions: spec.verify_row elements per position in the conv dtype (the
// backend's layout: the conv inputs, the raw gate and the beta logits) and,
// with VerifyMethod::kTokenStates, the state after every position [HV, K, V]
// fp32. A verify step leaves the slot's committed state as it is; the slot's
// pending count says how many positions its area holds until the commit.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/mem_cache/recurrent_state_spec.h"

namespace kda {

// Thrown when no slot is free: the scheduler queues the request and retries.
class PoolExhaustedError : public Error {
 public:
  using Error::Error;
};

// What a verify step keeps per position so that a commit can keep any number
// of them (docs/speculative.md has the measurements behind the default):
// kRecompute keeps the positions' projections and the commit reruns the conv
// and the recurrence over the kept ones; kTokenStates also keeps the state
// after every position (sglang's intermediate states) and the commit copies one.
enum class VerifyMethod : uint8_t { kRecompute, kTokenStates };

const char* VerifyMethodName(VerifyMethod method);
// "recompute" or "token_states" (kda::Error naming the choices otherwise).
VerifyMethod ParseVerifyMethod(std::string_view name);

// max_draft_tokens 0: no verify area (TARGET_VERIFY batches are refused).
struct VerifyConfig {
  int64_t max_draft_tokens = 0;  // k: a verify step holds up to k + 1 positions per request
  VerifyMethod method = VerifyMethod::kRecompute;
  int64_t rows() const { return max_draft_tokens > 0 ? max_draft_tokens + 1 : 0; }
};

// One layer's view of the pool: buffers indexed by slot.
struct LayerStateCache {
  float* recurrent = nullptr;  // [num_slots, HV, K, V]
  void* conv = nullptr;        // [num_slots, W-1, C]
  DType conv_dtype = DType::kF32;
  int64_t num_slots = 0;  // including the dummy slot 0
  // The verify area (null without one): per slot verify_rows positions.
  void* verify_inputs = nullptr;   // [num_slots, verify_rows, spec.verify_row] in conv_dtype
  float* verify_states = nullptr;  // [num_slots, verify_rows, HV, K, V] (kTokenStates only)
  int64_t verify_rows = 0;
};

class RecurrentStatePool {
 public:
  // `max_requests` usable slots (1..max_requests) for `num_layers` layers,
  // with a verify area per slot when verify.max_draft_tokens > 0.
  RecurrentStatePool(int num_layers, int64_t max_requests, const RecurrentStateSpec& spec, DType conv_dtype,
                     const VerifyConfig& verify = {});

  // Bytes one request costs: L*HV*K*V*4 + L*(W-1)*C*sizeof(conv dtype), plus
  // its verify area: L*(k+1)*verify_row*sizeof(conv dtype), and with
  // kTokenStates L*(k+1)*HV*K*V*4.
  static int64_t BytesPerRequest(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype,
                                 const VerifyConfig& verify = {});
  // Bytes of one request's verify area alone (0 without one).
  static int64_t VerifyBytesPerRequest(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype,
                                       const VerifyConfig& verify);
  // The largest pool whose slots (dummy included) fit in `budget_bytes`;
  // kda::Error if not even one request fits.
  static int64_t MaxRequestsForBudget(int64_t budget_bytes, int num_layers, const RecurrentStateSpec& spec,
                                      DType conv_dtype, const VerifyConfig& verify = {});
  // max_requests bounded by MaxRequestsForBudget where budget_bytes > 0 (0:
  // no limit): the capacity a server gives its pool under a memory budget.
  static int64_t CapacityWithinBudget(int64_t max_requests, int64_t budget_bytes, int num_layers,
                                      const RecurrentStateSpec& spec, DType conv_dtype,
                                      const VerifyConfig& verify = {});

  // A free slot, zeroed in every layer; PoolExhaustedError when none is free.
  int32_t Alloc();
  // Like Alloc, but empty instead of throwing when none is free.
  std::optional<int32_t> TryAlloc();
  // Returns a slot. Refused (kda::Error, pool unchanged): slot 0, out of
  // range, or not allocated (double free).
  void Free(int32_t slot);
  bool IsAllocated(int32_t slot) const;

  int64_t capacity() const { return max_requests_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int num_layers() const { return num_layers_; }
  const RecurrentStateSpec& spec() const { return spec_; }
  DType conv_dtype() const { return conv_dtype_; }
  const VerifyConfig& verify() const { return verify_; }
  int64_t total_bytes() const;
  int64_t conv_bytes_per_layer() const { return spec_.conv_size() * static_cast<int64_t>(DTypeSize(conv_dtype_)); }

  // Positions of the slot's last verify step still held for its commit (0:
  // none). The backend sets it when a verify step completes and clears it at
  // the commit; Alloc and Free clear it.
  int64_t pending_verify(int32_t slot) const { return IsAllocated(slot) ? verify_pending_[slot] : 0; }
  void SetPendingVerify(int32_t slot, int64_t positions);

  // One layer's cache (the buffers the backend and kernels index by slot).
  LayerStateCache GetLayerCache(int layer);
  // Copies one slot's state of one layer out / in: recurrent [HV, K, V] fp32,
  // conv [W-1, C] in conv_dtype. Set on slot 0 is dropped (the dummy is
  // never written); any other slot must be allocated.
  void GetLayerState(int layer, int32_t slot, float* recurrent, void* conv) const;
  void SetLayerState(int layer, int32_t slot, const float* recurrent, const void* conv);
  // The same for every layer at once, in one request's layout (a prefix-cache
  // snapshot's, a request's initial and final states): recurrent [L, HV, K, V]
  // fp32, then conv [L, W-1, C]. Either pointer may be null (not copied).
  void GetSlotState(int32_t slot, float* recurrent, void* conv) const;
  void SetSlotState(int32_t slot, const float* recurrent, const void* conv);
  // Elements (fp32) and bytes (conv dtype) of one request's states over all layers.
  int64_t recurrent_elems_per_request() const { return num_layers_ * spec_.recurrent_size(); }
  int64_t conv_bytes_per_request() const { return num_layers_ * conv_bytes_per_layer(); }

 private:
  void CheckLayer(int layer) const;
  void CheckAllocated(int32_t slot) const;
  void ZeroSlot(int32_t slot);

  int num_layers_;
  int64_t max_requests_;
  RecurrentStateSpec spec_;
  DType conv_dtype_;
  std::vector<std::vector<float>> recurrent_;  // per layer
  std::vector<std::vector<uint8_t>> conv_;     // per layer, raw conv_dtype elements
  VerifyConfig verify_;
  std::vector<std::vector<uint8_t>> verify_inputs_;  // per layer, see LayerStateCache
  std::vector<std::vector<float>> verify_states_;    // per layer (kTokenStates)
  std::vector<int32_t> free_;                        // free slots, smallest last
  std::vector<uint8_t> allocated_;                   // [max_requests + 1]
  std::vector<int64_t> verify_pending_;              // [max_requests + 1]
};

}  // namespace kda
