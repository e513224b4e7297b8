// Element types that cross the component's API; the untyped contiguous
// buffers tagged with one (ConstBuf, MutBuf), how kernels, layers and backends
// pass tensors whose dtype is chosen at run time (F32 or BF16); and tensor
// views (pointer, dtype, shape, strides), how a caller describes the tensors
// of a kernel call (kda/kernels/kda_args.h) before they are checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/base/f16.h"

namespace kda {

// I8 holds int8 projection weights and F16 their fp16 scales (kda/kernels/q8.h)
// in checkpoints; the KDA core kernels also take F16 tensors (fla's float16
// inputs); U8 holds masks (kda run's `computed`). The layers' activations are
// F32 or BF16.
enum class DType : uint8_t { kF32, kBF16, kI32, kI64, kU8, kI8, kF16 };

// Safetensors spelling: "F32", "BF16", "I32", "I64", "U8", "I8", "F16".
const char* DTypeName(DType t);
// Bytes per element (0 for a value outside the enum). Inline: the kernels call
// it where they address their buffers.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
    case DType::kI8:
      return 1;
  }
  return 0;
}

// Activation dtypes as torch and Hugging Face configs spell them: "float32"
// (F32) and "bfloat16" (BF16). The parser throws kda::Error naming any other
// string; the name of a non-activation dtype is "?".
DType ParseActivationDType(const std::string& name);
const char* ActivationDTypeName(DType t);

// The dtype as torch and numpy spell it: "float32", "bfloat16", "int32", "int64", "uint8", "int8", "float16".
const char* TorchDTypeName(DType t);

// "[d0, d1, ...]", for messages; beyond 16 dimensions the first 8 and "... (N dimensions)".
std::string ShapeString(const std::vector<int64_t>& shape);

// "[i0, i1, ...] (flat index F)": element `flat` of a row-major tensor of `shape`, for messages. `flat` must be
// in [0, product(shape)).
std::string ElementIndexString(const std::vector<int64_t>& shape, int64_t flat);

// Throws kda::Error "WHAT has a non-finite value (nan) at element [i, j] (flat index F)" for the first NaN or
// infinity of values[0, n), which hold a row-major tensor of `shape`. For untrusted data where it enters (input
// files, checkpoint weights); the kernels, layers and Forward never check their operands.
void CheckAllFinite(const float* values, int64_t n, const std::vector<int64_t>& shape, const std::string& what);

// Every element of a float-valued buffer (F32 or BF16) held as raw bytes.
std::vector<float> BytesToFloat(const std::vector<uint8_t>& bytes, DType t);

// Reads element i of a float-valued buffer (F32, BF16 or F16) as float.
inline float LoadAsFloat(const void* data, DType t, size_t i) {
  if (t == DType::kBF16) return ToFloat(static_cast<const BF16*>(data)[i]);
  if (t == DType::kF16) return ToFloat(static_cast<const F16*>(data)[i]);
  return static_cast<const float*>(data)[i];
}

// Writes element i of a float-valued buffer (F32, BF16 or F16), rounding to
// nearest even for BF16 and F16.
inline void StoreFromFloat(void* data, DType t, size_t i, float v) {
  if (t == DType::kBF16) {
    static_cast<BF16*>(data)[i] = ToBF16(v);
  } else if (t == DType::kF16) {
    static_cast<F16*>(data)[i] = ToF16(v);
  } else {
    static_cast<float*>(data)[i] = v;
  }
}

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

// A tensor as its caller holds it: pointer, dtype, shape and (optionally)
// strides, in elements. Nothing is checked when a view is made; the code that
// takes views checks them and names the argument in its errors. A view of
// ndim -1 is an absent optional argument. A null `data` with a shape is a
// shape-only view (tracing: the shape is known, the data not yet).
inline constexpr int kMaxViewDims = 8;

template <class Ptr>
struct BasicTensorView {
  Ptr data = nullptr;
  DType dtype = DType::kF32;
  // Set when the caller's dtype has no DType ("float64", "int16", ...): the
  // view is refused wherever it appears, the message naming this dtype.
  const char* foreign_dtype = nullptr;
  int ndim = -1;  // -1: absent
  int64_t shape[kMaxViewDims] = {};
  int64_t strides[kMaxViewDims] = {};  // in elements; read only when `strided`
  bool strided = false;                // false: C-contiguous

  bool present() const { return ndim >= 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
};

using TensorView = BasicTensorView<const void*>;
using MutTensorView = BasicTensorView<void*>;

// A view's data, or for an empty view without data (an empty batch: N = 0, or
// a pool of no states) a valid address: the kernels tell a pool form apart by
// its index pointer, so an empty one must not read as absent. Nothing is read
// through it.
template <class T, class View>
T* DataOrEmpty(const View& v) {
  static T empty{};
  return v.data != nullptr ? static_cast<T*>(v.data) : &empty;
}

// A C-contiguous view of `data` (at most kMaxViewDims dimensions; more are a
// programming error and throw std::invalid_argument).
template <class Ptr>
BasicTensorView<Ptr> ContiguousView(Ptr data, DType dtype, std::initializer_list<int64_t> shape);

// --- definitions ---

template <class Ptr>
BasicTensorView<Ptr> ContiguousView(Ptr data, DType dtype, std::initializer_list<int64_t> shape) {
  BasicTensorView<Ptr> v;
  if (shape.size() > static_cast<size_t>(kMaxViewDims)) throw std::invalid_argument("ContiguousView: too many dims");
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) v.shape[i++] = d;
  return v;
}

}  // namespace kda
