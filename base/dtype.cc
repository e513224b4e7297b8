#include "kda/base/dtype.h"

#include <cmath>

#include "kda/base/error.h"

namespace kda {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kF16:
      return "F16";
  }
  return "?";
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
  std::vector<float> r(bytes.size() / DTypeSize(t));
  for (size_t i = 0; i < r.size(); ++i) r[i] = LoadAsFloat(bytes.data(), t, i);
  return r;
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kI8:
      return 1;
  }
  return 0;
}

DType ParseActivationDType(const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  throw Error("unknown dtype '" + name + "' (expected float32 or bfloat16)");
}

const char* ActivationDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "?";
  }
}

}  // namespace kda
