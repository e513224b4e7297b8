#include "base/scratch.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include <sys/mman.h>

namespace kda {
namespace {

constexpr size_t kPooledMin = size_t{1} << 20;  // smaller blocks go straight to malloc
constexpr size_t kPoolCap = size_t{2} << 30;    // bytes kept for reuse at most
constexpr size_t kHugePage = size_t{2} << 20;

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // capacity -> block
  size_t kept = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: blocks may be released during exit
  return *pool;
}

constexpr size_t kLine = 64;

// At least `bytes` (rounded up to a multiple of align, *rounded) aligned to align.
void* AllocateAligned(size_t bytes, size_t align, size_t* rounded) {
  *rounded = bytes == 0 ? align : (bytes + align - 1) / align * align;
  void* data = std::aligned_alloc(align, *rounded);
  if (data == nullptr) throw std::bad_alloc();
  return data;
}

}  // namespace

void* AlignedAllocate(size_t bytes) {
  size_t rounded = 0;
  return AllocateAligned(bytes, kLine, &rounded);
}

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
  // Large blocks on 2 MiB pages where the kernel allows it: the KDA kernels
  // walk one row per token and head, a page apart, and 4 KiB pages make
  // those walks miss the TLB.
  const size_t align = bytes >= kHugePage ? kHugePage : kLine;
  data_ = AllocateAligned(bytes, align, &size_);
  if (align == kHugePage) madvise(data_, size_, MADV_HUGEPAGE);  // advice only: failure is harmless
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
