// A resizable buffer of float values stored in an activation dtype (F32 or
// BF16), for the working tensors of layers and backends.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/kernels/kda.h"

namespace kda {

class ActBuffer {
 public:
  ActBuffer() = default;
  ActBuffer(DType dtype, int64_t n) : dtype_(dtype) {
    if (dtype_ == DType::kBF16) {
      bf16_.assign(static_cast<size_t>(n), BF16{});
    } else {
      f32_.assign(static_cast<size_t>(n), 0.0F);
    }
  }
  void* data() { return dtype_ == DType::kBF16 ? static_cast<void*>(bf16_.data()) : static_cast<void*>(f32_.data()); }
  const void* data() const {
    return dtype_ == DType::kBF16 ? static_cast<const void*>(bf16_.data()) : static_cast<const void*>(f32_.data());
  }
  DType dtype() const { return dtype_; }
  MutBuf mut() { return {data(), dtype_}; }
  ConstBuf view() const { return {data(), dtype_}; }
  float Get(int64_t i) const { return LoadAsFloat(data(), dtype_, static_cast<size_t>(i)); }
  void Set(int64_t i, float v) { StoreFromFloat(data(), dtype_, static_cast<size_t>(i), v); }
  // All values as fp32.
  std::vector<float> ToFloat() const {
    if (dtype_ == DType::kF32) return f32_;
    std::vector<float> r(bf16_.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = kda::ToFloat(bf16_[i]);
    return r;
  }

 private:
  DType dtype_ = DType::kF32;
  std::vector<float> f32_;
  std::vector<BF16> bf16_;
};

// `b` advanced by `elems` elements of its dtype.
inline ConstBuf Offset(ConstBuf b, int64_t elems) {
  return {static_cast<const uint8_t*>(b.data) + elems * static_cast<int64_t>(DTypeSize(b.dtype)), b.dtype};
}
inline MutBuf Offset(MutBuf b, int64_t elems) {
  return {static_cast<uint8_t*>(b.data) + elems * static_cast<int64_t>(DTypeSize(b.dtype)), b.dtype};
}

}  // namespace kda
