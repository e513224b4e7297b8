// Arrays crossing the Python boundary: any DLPack or buffer-protocol array on
// the CPU (numpy, torch CPU tensors, JAX CPU arrays), read in place. Shape,
// dtype, device and layout problems are refused with the argument's name
// before any kernel runs: dtype and device problems as TypeError, shape and
// layout problems as ValueError.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kda/base/dtype.h"

namespace kda::python {

namespace nb = nanobind;

// Read-only and writable views of an array of any dtype, shape and device.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// The exact dtype required of an array (F32, I32, I64); TypeError otherwise.
template <class A>
void RequireDType(const A& a, DType want, const char* name);

// Shape as a vector, for checks and messages.
template <class A>
std::vector<int64_t> ShapeOf(const A& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<int64_t>(a.shape(i));
  return s;
}

// On the CPU and C-contiguous (ValueError / TypeError naming the argument).
template <class A>
void RequireCpuContiguous(const A& a, const char* name);

// ValueError "NAME: expected shape LAYOUT = [..], got [..]" unless the shape is `want`.
template <class A>
void RequireShape(const A& a, const std::vector<int64_t>& want, const char* name, const char* layout) {
  if (ShapeOf(a) != want) {
    throw nb::value_error((std::string(name) + ": expected shape " + layout + " = " + ShapeString(want) + ", got " +
                           ShapeString(ShapeOf(a)))
                              .c_str());
  }
}

// ValueError unless the array has `ndim` dimensions.
template <class A>
void RequireNdim(const A& a, size_t ndim, const char* name, const char* layout) {
  if (a.ndim() != ndim) {
    throw nb::value_error((std::string(name) + ": expected a " + std::to_string(ndim) + "-D array " + layout +
                           ", got shape " + ShapeString(ShapeOf(a)))
                              .c_str());
  }
}

// --- definitions ---

// numpy's name of a DLPack dtype, for messages. uint16 is named "bfloat16": only bf16 arrays reach the core as
// uint16 (kda._arrays.for_core refuses real uint16 arrays).
inline const char* DlpackDTypeName(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  struct Name {
    Code code;
    int bits;
    const char* name;
  };
  static constexpr Name kNames[] = {
      {Code::Float, 16, "float16"},   {Code::Float, 32, "float32"},     {Code::Float, 64, "float64"},
      {Code::Bfloat, 16, "bfloat16"}, {Code::Int, 8, "int8"},           {Code::Int, 16, "int16"},
      {Code::Int, 32, "int32"},       {Code::Int, 64, "int64"},         {Code::UInt, 8, "uint8"},
      {Code::UInt, 16, "bfloat16"},   {Code::UInt, 32, "uint32"},       {Code::UInt, 64, "uint64"},
      {Code::Bool, 8, "bool"},        {Code::Complex, 64, "complex64"}, {Code::Complex, 128, "complex128"},
  };
  for (const Name& n : kNames) {
    if (d.code == static_cast<uint8_t>(n.code) && d.bits == n.bits && d.lanes == 1) return n.name;
  }
  return "an unknown dtype";
}

inline bool IsDType(nb::dlpack::dtype d, nb::dlpack::dtype_code code, int bits) {
  return d.code == static_cast<uint8_t>(code) && d.bits == bits && d.lanes == 1;
}

// The kda dtype of a DLPack dtype; false when there is none. uint16 is BF16:
// numpy has no native bfloat16, so kda's Python layer passes
// ml_dtypes.bfloat16 arrays as uint16 views of their bits.
template <class View>
bool SetDType(View& v, nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  struct Map {
    Code code;
    int bits;
    DType dtype;
  };
  static constexpr Map kMap[] = {
      {Code::Float, 32, DType::kF32}, {Code::Bfloat, 16, DType::kBF16}, {Code::UInt, 16, DType::kBF16},
      {Code::Int, 32, DType::kI32},   {Code::Int, 64, DType::kI64},     {Code::UInt, 8, DType::kU8},
      {Code::Int, 8, DType::kI8},     {Code::Float, 16, DType::kF16},
  };
  for (const Map& m : kMap) {
    if (IsDType(d, m.code, m.bits)) {
      v.dtype = m.dtype;
      return true;
    }
  }
  return false;
}

template <class A>
void RequireDType(const A& a, DType want, const char* name) {
  struct {
    DType dtype = DType::kF32;
  } got;
  if (!SetDType(got, a.dtype()) || got.dtype != want) {
    throw nb::type_error(
        (std::string(name) + ": dtype must be " + TorchDTypeName(want) + ", got " + DlpackDTypeName(a.dtype()))
            .c_str());
  }
}

template <class A>
void RequireCpu(const A& a, const char* name) {
  if (a.device_type() != nb::device::cpu::value) {
    throw nb::type_error(
        (std::string(name) + ": must be a CPU array (DLPack device type " + std::to_string(a.device_type()) + ")")
            .c_str());
  }
}

template <class A>
void RequireCpuContiguous(const A& a, const char* name) {
  RequireCpu(a, name);
  if (a.size() == 0) return;  // no elements: any strides will do
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) {
      throw nb::value_error((std::string(name) + ": must be C-contiguous (row-major, no gaps); shape " +
                             ShapeString(ShapeOf(a)) + " has stride " + std::to_string(a.stride(i)) + " in dimension " +
                             std::to_string(i) + " (make a contiguous copy first)")
                                .c_str());
    }
    expected *= static_cast<int64_t>(a.shape(i));
  }
}

}  // namespace kda::python
