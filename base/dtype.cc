#include "kda/base/dtype.h"

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
  }
  return "?";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
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
      return 2;
    case DType::kI64:
      return 8;
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
