// A resizable buffer of float values stored in an activation dtype (F32 or
// BF16), for the working tensors of layers and backends.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/scratch.h"
#include "kda/base/dtype.h"

namespace kda {

class ActBuffer {
 public:
  ActBuffer() = default;
  // n zeros.
  ActBuffer(DType dtype, int64_t n) : ActBuffer(dtype, n, /*zero=*/true) {}
  // n uninitialised values (for buffers that are written whole before they are read).
  static ActBuffer Uninitialized(DType dtype, int64_t n) { return ActBuffer(dtype, n, /*zero=*/false); }

  void* data() { return block_.data(); }
  const void* data() const { return block_.data(); }
  DType dtype() const { return dtype_; }
  int64_t size() const { return n_; }
  MutBuf mut() { return {data(), dtype_}; }
  ConstBuf view() const { return {data(), dtype_}; }
  float Get(int64_t i) const { return LoadAsFloat(data(), dtype_, static_cast<size_t>(i)); }
  void Set(int64_t i, float v) { StoreFromFloat(data(), dtype_, static_cast<size_t>(i), v); }
  // All values as fp32.
  std::vector<float> ToFloat() const {
    std::vector<float> r(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) r[static_cast<size_t>(i)] = Get(i);
    return r;
  }

 private:
  ActBuffer(DType dtype, int64_t n, bool zero)
      : dtype_(dtype), n_(n), block_(static_cast<size_t>(n) * DTypeSize(dtype)) {
    if (zero && n > 0) std::memset(block_.data(), 0, static_cast<size_t>(n) * DTypeSize(dtype));
  }

  DType dtype_ = DType::kF32;
  int64_t n_ = 0;
  ScratchBlock block_;
};

// `b` advanced by `elems` elements of its dtype.
inline ConstBuf Offset(ConstBuf b, int64_t elems) {
  return {static_cast<const uint8_t*>(b.data) + elems * static_cast<int64_t>(DTypeSize(b.dtype)), b.dtype};
}
inline MutBuf Offset(MutBuf b, int64_t elems) {
  return {static_cast<uint8_t*>(b.data) + elems * static_cast<int64_t>(DTypeSize(b.dtype)), b.dtype};
}

}  // namespace kda
