// The request -> slot map of the recurrent-state pool (HybridReqToTokenPool,
// mem_cache/memory_pools.cc), and MemoryPools, the pools a model runner passes
// down to the attention backend.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kda/mem_cache/recurrent_state_pool.h"

namespace kda {

// Request id -> pool slot, for the requests that currently hold one.
class HybridReqToTokenPool {
 public:
  explicit HybridReqToTokenPool(RecurrentStatePool* pool) : pool_(pool) {}

  // Allocates a slot for `req_id` (kda::Error if it already holds one;
  // PoolExhaustedError when none is free).
  int32_t Alloc(int64_t req_id);
  // Releases the request's slot (kda::Error if it holds none).
  void Free(int64_t req_id);
  bool Has(int64_t req_id) const { return slots_.count(req_id) > 0; }
  // kda::Error if the request holds no slot.
  int32_t SlotOf(int64_t req_id) const;
  // Whether `slot` is the one `req_id` holds (an array lookup: for checking a
  // batch that carries its slots).
  bool Holds(int64_t req_id, int32_t slot) const {
    return slot >= 0 && static_cast<size_t>(slot) < holder_.size() && holder_[slot] == req_id;
  }
  int64_t size() const { return static_cast<int64_t>(slots_.size()); }
  RecurrentStatePool* state_pool() const { return pool_; }

 private:
  RecurrentStatePool* pool_;
  std::unordered_map<int64_t, int32_t> slots_;
  std::vector<int64_t> holder_;  // [slot] the request holding it, -1 when free
};

// The pools of a model: the ModelRunner owns the reference and passes it to
// its attention backend; a Scheduler takes them from its runner.
struct MemoryPools {
  RecurrentStatePool* state_pool = nullptr;
  HybridReqToTokenPool* req_to_token_pool = nullptr;
};

}  // namespace kda
