#include "base/scratch.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace kda {
namespace {

constexpr size_t kPooledMin = size_t{1} << 20;  // smaller blocks go straight to malloc
constexpr size_t kPoolCap = size_t{2} << 30;    // bytes kept for reuse at most

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // capacity -> block
  size_t kept = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: blocks may be released during exit
  return *pool;
}

}  // namespace

ScratchBlock::ScratchBlock(size_t bytes) {
  if (bytes == 0) return;
  if (bytes >= kPooledMin) {
    Pool& p = ThePool();
    std::lock_guard<std::mutex> lock(p.mu);
    // Best fit, but not a block more than twice the size asked for.
    auto it = p.free_blocks.lower_bound(bytes);
    if (it != p.free_blocks.end() && it->first <= 2 * bytes) {
      size_ = it->first;
      data_ = it->second;
      p.kept -= it->first;
      p.free_blocks.erase(it);
      return;
    }
  }
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded);
  if (data_ == nullptr) throw std::bad_alloc();
  size_ = rounded;
}

ScratchBlock::~ScratchBlock() {
  if (data_ == nullptr) return;
  if (size_ >= kPooledMin) {
    Pool& p = ThePool();
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.kept + size_ <= kPoolCap) {
      p.free_blocks.emplace(size_, data_);
      p.kept += size_;
      return;
    }
  }
  std::free(data_);
}

}  // namespace kda
