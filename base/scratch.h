// Temporary working memory reused across calls. A layer's forward allocates
// hundreds of MiB of activations; fresh allocations of that size come from
// mmap and page-fault on first touch every call. Released blocks are kept (up
// to a cap) and handed out again to requests of a similar size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace kda {

// An uninitialised, 64-byte aligned block of at least `bytes` bytes.
class ScratchBlock {
 public:
  ScratchBlock() = default;
  explicit ScratchBlock(size_t bytes);
  ~ScratchBlock();
  ScratchBlock(ScratchBlock&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ScratchBlock& operator=(ScratchBlock&& o) noexcept {
    if (this != &o) {
      ScratchBlock tmp(std::move(*this));
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ScratchBlock(const ScratchBlock&) = delete;
  ScratchBlock& operator=(const ScratchBlock&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;  // capacity of the block
};

// n elements of a trivially copyable T in a ScratchBlock; uninitialised
// unless `zero`.
template <class T>
class ScratchArray {
 public:
  ScratchArray() = default;
  explicit ScratchArray(size_t n, bool zero = false) : block_(n * sizeof(T)), n_(n) {
    if (zero && n > 0) std::memset(block_.data(), 0, n * sizeof(T));
  }
  T* data() const { return static_cast<T*>(block_.data()); }
  size_t size() const { return n_; }
  T& operator[](size_t i) const { return data()[i]; }

 private:
  ScratchBlock block_;
  size_t n_ = 0;
};

// Long-lived arrays (a Linear's weights) on 64-byte lines. The tile GEMM
// reads weight rows 64 bytes at a time; malloc's 16-byte alignment split every
// such read over two cache lines and ran the tile products at half speed.
void* AlignedAllocate(size_t bytes);
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  explicit AlignedAllocator(const AlignedAllocator<U>& /*other*/) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(AlignedAllocate(n * sizeof(T))); }
  void deallocate(T* p, size_t /*n*/) noexcept { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>& /*other*/) const noexcept {
    return true;
  }
};
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace kda
