#include "kda/mem_cache/memory_pools.h"

#include <string>

#include "kda/base/error.h"

namespace kda {

int32_t HybridReqToTokenPool::Alloc(int64_t req_id) {
  Check(!Has(req_id), "request " + std::to_string(req_id) + " already holds a state slot");
  const int32_t slot = pool_->Alloc();
  slots_.emplace(req_id, slot);
  if (static_cast<size_t>(slot) >= holder_.size()) holder_.resize(static_cast<size_t>(slot) + 1, -1);
  holder_[slot] = req_id;
  return slot;
}

void HybridReqToTokenPool::Free(int64_t req_id) {
  auto it = slots_.find(req_id);
  Check(it != slots_.end(), "request " + std::to_string(req_id) + " holds no state slot");
  pool_->Free(it->second);
  holder_[it->second] = -1;
  slots_.erase(it);
}

int32_t HybridReqToTokenPool::SlotOf(int64_t req_id) const {
  auto it = slots_.find(req_id);
  Check(it != slots_.end(), "request " + std::to_string(req_id) + " holds no state slot");
  return it->second;
}

}  // namespace kda
