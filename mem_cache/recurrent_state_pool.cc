#include "kda/mem_cache/recurrent_state_pool.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>

#include "base/fault_inject.h"

namespace kda {

const char* VerifyMethodName(VerifyMethod method) {
  return method == VerifyMethod::kTokenStates ? "token_states" : "recompute";
}

VerifyMethod ParseVerifyMethod(std::string_view name) {
  if (name == "recompute") return VerifyMethod::kRecompute;
  Check(name == "token_states",
        [&] { return "verify_method must be 'recompute' or 'token_states', got '" + std::string(name) + "'"; });
  return VerifyMethod::kTokenStates;
}

RecurrentStatePool::RecurrentStatePool(int num_layers, int64_t max_requests, const RecurrentStateSpec& spec,
                                       DType conv_dtype, const VerifyConfig& verify)
    : num_layers_(num_layers), max_requests_(max_requests), spec_(spec), conv_dtype_(conv_dtype), verify_(verify) {
  Check(num_layers >= 1, "state pool: needs at least one layer");
  Check(max_requests >= 1, "state pool: needs at least one request slot");
  Check(max_requests < (int64_t{1} << 31) - 1, "state pool: too many slots");
  Check(spec.valid(), "state pool: invalid state shape");
  Check(conv_dtype == DType::kF32 || conv_dtype == DType::kBF16, "state pool: conv dtype must be F32 or BF16");
  Check(verify.max_draft_tokens >= 0 && verify.max_draft_tokens <= 64,
        "state pool: max_draft_tokens must be in [0, 64], got " + std::to_string(verify.max_draft_tokens));
  const auto slots = static_cast<size_t>(max_requests + 1);
  try {
    MaybeInjectFault(FaultPoint::kAlloc);
    recurrent_.resize(static_cast<size_t>(num_layers));
    conv_.resize(static_cast<size_t>(num_layers));
    for (int l = 0; l < num_layers; ++l) {
      recurrent_[l].assign(slots * spec.recurrent_size(), 0.0F);
      conv_[l].assign(slots * spec.conv_size() * DTypeSize(conv_dtype), 0);
    }
    if (verify.rows() > 0) {
      verify_inputs_.resize(static_cast<size_t>(num_layers));
      for (auto& v : verify_inputs_) v.resize(slots * verify.rows() * spec.verify_row * DTypeSize(conv_dtype));
      if (verify.method == VerifyMethod::kTokenStates) {
        verify_states_.resize(static_cast<size_t>(num_layers));
        for (auto& v : verify_states_) v.resize(slots * verify.rows() * spec.recurrent_size());
      }
    }
    allocated_.assign(slots, 0);
    verify_pending_.assign(slots, 0);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // std::bad_alloc, or std::length_error beyond what a vector can hold
    throw Error("state pool: cannot allocate " + std::to_string(total_bytes()) + " bytes (" +
                std::to_string(max_requests) + " slots + the dummy of " +
                std::to_string(BytesPerRequest(num_layers, spec, conv_dtype, verify)) +
                " bytes each): out of memory (" + e.what() + ")");
  }
  // Hand out low slots first: pop_back takes the smallest.
  for (auto s = static_cast<int32_t>(max_requests); s >= 1; --s) free_.push_back(s);
}

int64_t RecurrentStatePool::VerifyBytesPerRequest(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype,
                                                  const VerifyConfig& verify) {
  int64_t per_row = spec.verify_row * static_cast<int64_t>(DTypeSize(conv_dtype));
  if (verify.method == VerifyMethod::kTokenStates) per_row += spec.recurrent_size() * 4;
  return num_layers * verify.rows() * per_row;
}

int64_t RecurrentStatePool::BytesPerRequest(int num_layers, const RecurrentStateSpec& spec, DType conv_dtype,
                                            const VerifyConfig& verify) {
  return num_layers * (spec.recurrent_size() * 4 + spec.conv_size() * static_cast<int64_t>(DTypeSize(conv_dtype))) +
         VerifyBytesPerRequest(num_layers, spec, conv_dtype, verify);
}

int64_t RecurrentStatePool::MaxRequestsForBudget(int64_t budget_bytes, int num_layers, const RecurrentStateSpec& spec,
                                                 DType conv_dtype, const VerifyConfig& verify) {
  const int64_t per = BytesPerRequest(num_layers, spec, conv_dtype, verify);
  Check(per > 0, "state pool: empty state shape");
  const int64_t slots = budget_bytes / per;  // the dummy slot costs one request's bytes
  Check(slots >= 2, "state pool: a budget of " + std::to_string(budget_bytes) + " bytes holds no request (" +
                        std::to_string(per) + " bytes per request plus the dummy slot)");
  return slots - 1;
}

int64_t RecurrentStatePool::CapacityWithinBudget(int64_t max_requests, int64_t budget_bytes, int num_layers,
                                                 const RecurrentStateSpec& spec, DType conv_dtype,
                                                 const VerifyConfig& verify) {
  if (budget_bytes <= 0) return max_requests;
  return std::min(max_requests, MaxRequestsForBudget(budget_bytes, num_layers, spec, conv_dtype, verify));
}

int64_t RecurrentStatePool::total_bytes() const {
  return (max_requests_ + 1) * BytesPerRequest(num_layers_, spec_, conv_dtype_, verify_);
}

void RecurrentStatePool::SetPendingVerify(int32_t slot, int64_t positions) {
  CheckAllocated(slot);
  Check(slot != 0 && positions >= 0 && positions <= verify_.rows(), [&] {
    return "state pool: " + std::to_string(positions) + " pending verify positions for slot " + std::to_string(slot) +
           " (its verify area holds " + std::to_string(verify_.rows()) + ")";
  });
  verify_pending_[slot] = positions;
}

void RecurrentStatePool::ZeroSlot(int32_t slot) {
  const int64_t rs = spec_.recurrent_size();
  const int64_t cs = spec_.conv_size() * static_cast<int64_t>(DTypeSize(conv_dtype_));
  for (int l = 0; l < num_layers_; ++l) {
    std::fill_n(recurrent_[l].data() + slot * rs, rs, 0.0F);
    std::fill_n(conv_[l].data() + slot * cs, cs, uint8_t{0});  // +0.0 in F32 and BF16
  }
}

std::optional<int32_t> RecurrentStatePool::TryAlloc() {
  if (free_.empty()) return std::nullopt;
  const int32_t slot = free_.back();
  free_.pop_back();
  allocated_[slot] = 1;
  verify_pending_[slot] = 0;
  ZeroSlot(slot);
  return slot;
}

int32_t RecurrentStatePool::Alloc() {
  const std::optional<int32_t> slot = TryAlloc();
  if (!slot) {
    throw PoolExhaustedError("state pool exhausted: all " + std::to_string(max_requests_) + " slots are in use");
  }
  return *slot;
}

void RecurrentStatePool::Free(int32_t slot) {
  Check(slot != 0, "state pool: slot 0 is the dummy slot and cannot be freed");
  Check(slot > 0 && slot <= max_requests_, [&] {
    return "state pool: slot " + std::to_string(slot) + " out of range [1, " + std::to_string(max_requests_) + "]";
  });
  Check(allocated_[slot] != 0,
        [&] { return "state pool: slot " + std::to_string(slot) + " is not allocated (double free?)"; });
  allocated_[slot] = 0;
  verify_pending_[slot] = 0;
  free_.push_back(slot);
}

bool RecurrentStatePool::IsAllocated(int32_t slot) const {
  return slot > 0 && slot <= max_requests_ && allocated_[slot] != 0;
}

void RecurrentStatePool::CheckLayer(int layer) const {
  Check(layer >= 0 && layer < num_layers_, [&] {
    return "state pool: layer " + std::to_string(layer) + " out of range [0, " + std::to_string(num_layers_) + ")";
  });
}

void RecurrentStatePool::CheckAllocated(int32_t slot) const {
  Check(slot >= 0 && slot <= max_requests_, [&] {
    return "state pool: slot " + std::to_string(slot) + " out of range [0, " + std::to_string(max_requests_) + "]";
  });
  Check(slot == 0 || allocated_[slot] != 0,
        [&] { return "state pool: slot " + std::to_string(slot) + " is not allocated"; });
}

LayerStateCache RecurrentStatePool::GetLayerCache(int layer) {
  CheckLayer(layer);
  LayerStateCache c;
  c.recurrent = recurrent_[layer].data();
  c.conv = conv_[layer].data();
  c.conv_dtype = conv_dtype_;
  c.num_slots = max_requests_ + 1;
  if (verify_.rows() > 0) {
    c.verify_inputs = verify_inputs_[layer].data();
    c.verify_states = verify_states_.empty() ? nullptr : verify_states_[layer].data();
    c.verify_rows = verify_.rows();
  }
  return c;
}

void RecurrentStatePool::GetLayerState(int layer, int32_t slot, float* recurrent, void* conv) const {
  CheckLayer(layer);
  CheckAllocated(slot);
  const int64_t rs = spec_.recurrent_size();
  const int64_t cs = spec_.conv_size() * static_cast<int64_t>(DTypeSize(conv_dtype_));
  if (recurrent != nullptr) std::memcpy(recurrent, recurrent_[layer].data() + slot * rs, rs * sizeof(float));
  if (conv != nullptr && cs > 0) std::memcpy(conv, conv_[layer].data() + slot * cs, cs);
}

void RecurrentStatePool::SetLayerState(int layer, int32_t slot, const float* recurrent, const void* conv) {
  CheckLayer(layer);
  CheckAllocated(slot);
  if (slot == 0) return;  // writes to the dummy slot are dropped
  const int64_t rs = spec_.recurrent_size();
  const int64_t cs = spec_.conv_size() * static_cast<int64_t>(DTypeSize(conv_dtype_));
  if (recurrent != nullptr) std::memcpy(recurrent_[layer].data() + slot * rs, recurrent, rs * sizeof(float));
  if (conv != nullptr && cs > 0) std::memcpy(conv_[layer].data() + slot * cs, conv, cs);
}

void RecurrentStatePool::GetSlotState(int32_t slot, float* recurrent, void* conv) const {
  const int64_t cs = conv_bytes_per_layer();
  for (int l = 0; l < num_layers_; ++l) {
    GetLayerState(l, slot, recurrent != nullptr ? recurrent + l * spec_.recurrent_size() : nullptr,
                  conv != nullptr ? static_cast<uint8_t*>(conv) + l * cs : nullptr);
  }
}

void RecurrentStatePool::SetSlotState(int32_t slot, const float* recurrent, const void* conv) {
  const int64_t cs = conv_bytes_per_layer();
  for (int l = 0; l < num_layers_; ++l) {
    SetLayerState(l, slot, recurrent != nullptr ? recurrent + l * spec_.recurrent_size() : nullptr,
                  conv != nullptr ? static_cast<const uint8_t*>(conv) + l * cs : nullptr);
  }
}

}  // namespace kda
