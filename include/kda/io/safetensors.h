// Safetensors files: a validating, memory-mapped reader and an atomic writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header, then the data section. The header maps
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section),
// plus an optional "__metadata__" string->string map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "kda/base/dtype.h"

namespace kda {

// One tensor of an open SafetensorsFile. `data` points into the file's read-only mapping and stays valid as long
// as the SafetensorsFile (or whatever it was moved into) lives. `data` is only guaranteed to be byte-aligned:
// a file's tensors need not start at a multiple of their element size, so read it through memcpy or the
// ToFloatVector / ToInt64Vector helpers rather than by casting the pointer.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first; empty for a scalar
  const uint8_t* data = nullptr;
  size_t nbytes = 0;  // == numel() * DTypeSize(dtype)

  // The product of `shape` (0 when any dimension is 0, whatever the others). A TensorInfo built by hand may hold
  // anything: a negative dimension or a count past int64 is a kda::Error, never a wrapped value.
  int64_t numel() const;
};

// A safetensors file opened read-only through mmap. Everything in the header is checked before it is trusted;
// every problem is a kda::Error whose message has the path and names the problem. Accepted dtypes: F32, BF16,
// I32, I64, I8, F16. The tensors must tile the data section exactly: no overlap, no gap, nothing after the last one.
// Movable, not copyable.
class SafetensorsFile {
 public:
  static SafetensorsFile Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  bool Has(const std::string& name) const;
  // Throws kda::Error "tensor 'NAME' not found in PATH" when absent.
  const TensorInfo& Get(const std::string& name) const;
  // In data-section order (increasing offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The "__metadata__" map of the header (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void Unmap() noexcept;

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Copies an F32 or BF16 tensor out as float (numel() values); other dtypes are a kda::Error.
std::vector<float> ToFloatVector(const TensorInfo& tensor);
// Copies an I32 or I64 tensor out as int64 (numel() values); other dtypes are a kda::Error.
std::vector<int64_t> ToInt64Vector(const TensorInfo& tensor);

// A tensor for WriteSafetensors. `data` holds product(shape) * DTypeSize(dtype) bytes, row-major (may be null
// only when that is 0).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file: the tensors' data in the given order, the header padded with spaces to a multiple
// of 8 bytes. Writes PATH.tmp.<pid> and renames it over `path`, so `path` is either untouched or complete. On any
// failure (empty, reserved or duplicate name, negative dimension, I/O error) the temp file is removed and a
// kda::Error is thrown. Not safe for two threads of one process writing the same path at once.
void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace kda
