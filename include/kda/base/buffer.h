// Untyped contiguous buffers with their element type: how kernels, layers and
// backends pass tensors whose dtype is chosen at run time (F32 or BF16).
#pragma once

#include "kda/base/dtype.h"

namespace kda {

// A contiguous read-only buffer with its element type.
struct ConstBuf {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

// A contiguous writable buffer with its element type.
struct MutBuf {
  void* data = nullptr;
  DType dtype = DType::kF32;
};

}  // namespace kda
