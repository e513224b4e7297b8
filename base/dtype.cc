#include "kda/base/dtype.h"

#include <cmath>
#include <iterator>

#include "kda/base/error.h"

namespace kda {

namespace {

// Each DType's names, in the enum's order (sizes: DTypeSize in the header).
struct DTypeInfo {
  DType dtype;
  const char* safetensors;  // "F32", ...
  const char* torch;        // "float32", ...
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", "float32"}, {DType::kBF16, "BF16", "bfloat16"}, {DType::kI32, "I32", "int32"},
    {DType::kI64, "I64", "int64"},   {DType::kU8, "U8", "uint8"},        {DType::kI8, "I8", "int8"},
    {DType::kF16, "F16", "float16"},
};

const DTypeInfo* InfoOf(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) && kDTypes[i].dtype == t ? &kDTypes[i] : nullptr;
}

}  // namespace

const char* DTypeName(DType t) {
  const DTypeInfo* info = InfoOf(t);
  return info != nullptr ? info->safetensors : "?";
}

const char* TorchDTypeName(DType t) {
  const DTypeInfo* info = InfoOf(t);
  return info != nullptr ? info->torch : "?";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  // A shape from a file may have any number of dimensions: long ones are shown by their first few.
  constexpr size_t kMaxShown = 8;
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    if (i == kMaxShown && shape.size() > 2 * kMaxShown) {
      s += "... (";
      s += std::to_string(shape.size());
      s += " dimensions)";
      break;
    }
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string ElementIndexString(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size(), 0);
  int64_t rest = flat;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] <= 0) continue;
    index[i] = rest % shape[i];
    rest /= shape[i];
  }
  return ShapeString(index) + " (flat index " + std::to_string(flat) + ")";
}

void CheckAllFinite(const float* values, int64_t n, const std::vector<int64_t>& shape, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[i];
    if (std::isfinite(v)) continue;
    const char* kind = std::isnan(v) ? "nan" : (v > 0 ? "+inf" : "-inf");
    throw Error(what + " has a non-finite value (" + kind + ") at element " + ElementIndexString(shape, i));
  }
}

std::vector<float> BytesToFloat(const std::vector<uint8_t>& bytes, DType t) {
  const size_t esize = DTypeSize(t);
  Check(esize > 0, "BytesToFloat: not an element type");
  std::vector<float> r(bytes.size() / esize);
  for (size_t i = 0; i < r.size(); ++i) r[i] = LoadAsFloat(bytes.data(), t, i);
  return r;
}

DType ParseActivationDType(const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  throw Error("unknown dtype '" + name + "' (expected float32 or bfloat16)");
}

const char* ActivationDTypeName(DType t) { return t == DType::kF32 || t == DType::kBF16 ? TorchDTypeName(t) : "?"; }

}  // namespace kda
