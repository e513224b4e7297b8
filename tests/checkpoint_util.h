// Writing altered copies of a checkpoint, for tests of what loading refuses.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"

namespace kda::testing {

// Copies the checkpoint in `src_dir` (config.json + model.safetensors) to `dst_dir`, with element `flat` of
// tensor `name` (F32 or BF16) set to `value`.
inline void CopyCheckpointWithValue(const std::string& src_dir, const std::string& dst_dir, const std::string& name,
                                    int64_t flat, float value) {
  namespace fs = std::filesystem;
  fs::create_directories(dst_dir);
  fs::copy_file(fs::path(src_dir) / "config.json", fs::path(dst_dir) / "config.json",
                fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::Open((fs::path(src_dir) / "model.safetensors").string());
  std::vector<std::vector<uint8_t>> data;
  data.reserve(src.tensors().size());
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : src.tensors()) {
    data.emplace_back(t.data, t.data + t.nbytes);
    if (t.name == name) {
      uint8_t* at = data.back().data() + static_cast<size_t>(flat) * DTypeSize(t.dtype);
      if (t.dtype == DType::kBF16) {
        const BF16 b = ToBF16(value);
        std::memcpy(at, &b.bits, sizeof(b.bits));
      } else {
        std::memcpy(at, &value, sizeof(value));
      }
    }
    tensors.push_back({t.name, t.dtype, t.shape, data.back().data()});
  }
  WriteSafetensors((fs::path(dst_dir) / "model.safetensors").string(), tensors, src.metadata());
}

// Copies a one-file checkpoint like CopyCheckpointWithValue, with the raw
// bytes of element `flat` of tensor `name` (any dtype) set to `bytes`
// (DTypeSize of its dtype), e.g. an int8 value or an fp16 scale.
inline void CopyCheckpointWithRawElement(const std::string& src_dir, const std::string& dst_dir,
                                         const std::string& name, int64_t flat, const void* bytes) {
  namespace fs = std::filesystem;
  fs::create_directories(dst_dir);
  fs::copy_file(fs::path(src_dir) / "config.json", fs::path(dst_dir) / "config.json",
                fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::Open((fs::path(src_dir) / "model.safetensors").string());
  std::vector<std::vector<uint8_t>> data;
  data.reserve(src.tensors().size());
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : src.tensors()) {
    data.emplace_back(t.data, t.data + t.nbytes);
    if (t.name == name) std::memcpy(data.back().data() + flat * DTypeSize(t.dtype), bytes, DTypeSize(t.dtype));
    tensors.push_back({t.name, t.dtype, t.shape, data.back().data()});
  }
  WriteSafetensors((fs::path(dst_dir) / "model.safetensors").string(), tensors, src.metadata());
}

// Copies a one-file checkpoint with every KDA Linear projection
// (`*.self_attn.{q,k,v,o,f_a,f_b,g_a,g_b,b}_proj.weight`, [out, in]) replaced
// by its Q8 round trip DequantizeQ8(QuantizeQ8(w)), stored as F32 (exact):
// the dense model that int8 weights must equal (kda/kernels/q8.h).
inline void WriteDequantizedCheckpoint(const std::string& src_dir, const std::string& dst_dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dst_dir);
  fs::copy_file(fs::path(src_dir) / "config.json", fs::path(dst_dir) / "config.json",
                fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::Open((fs::path(src_dir) / "model.safetensors").string());
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<float>> floats;
  data.reserve(src.tensors().size());
  floats.reserve(src.tensors().size());
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : src.tensors()) {
    const std::string& n = t.name;
    const bool proj = n.find(".self_attn.") != std::string::npos && n.ends_with("_proj.weight") && t.shape.size() == 2;
    if (proj) {
      floats.push_back(DequantizeQ8(QuantizeQ8(ToFloatVector(t), t.shape[0], t.shape[1], n)));
      tensors.push_back({n, DType::kF32, t.shape, floats.back().data()});
    } else {
      data.emplace_back(t.data, t.data + t.nbytes);
      tensors.push_back({n, t.dtype, t.shape, data.back().data()});
    }
  }
  WriteSafetensors((fs::path(dst_dir) / "model.safetensors").string(), tensors, src.metadata());
}

}  // namespace kda::testing
