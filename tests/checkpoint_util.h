// Writing altered copies of a checkpoint, for tests of what loading refuses.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kda/base/bf16.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"

namespace kda::testing {

// A tensor of a checkpoint being copied: its dtype and bytes, which an edit
// may change (the shape stays).
struct TensorCopy {
  DType dtype;
  std::vector<uint8_t> bytes;
};

// Copies the one-file checkpoint in `src_dir` (config.json +
// model.safetensors) to `dst_dir`, each tensor passed through edit(info,
// copy) on its way.
inline void CopyCheckpoint(const std::string& src_dir, const std::string& dst_dir,
                           const std::function<void(const TensorInfo&, TensorCopy&)>& edit) {
  namespace fs = std::filesystem;
  fs::create_directories(dst_dir);
  fs::copy_file(fs::path(src_dir) / "config.json", fs::path(dst_dir) / "config.json",
                fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::Open((fs::path(src_dir) / "model.safetensors").string());
  std::vector<TensorCopy> copies;
  copies.reserve(src.tensors().size());
  for (const TensorInfo& t : src.tensors()) {
    copies.push_back({t.dtype, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
    edit(t, copies.back());
  }
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < copies.size(); ++i) {
    const TensorInfo& t = src.tensors()[i];
    tensors.push_back({t.name, copies[i].dtype, t.shape, copies[i].bytes.data()});
  }
  WriteSafetensors((fs::path(dst_dir) / "model.safetensors").string(), tensors, src.metadata());
}

// Copies a one-file checkpoint with the raw bytes of element `flat` of tensor
// `name` (any dtype) set to `bytes` (DTypeSize of its dtype), e.g. an int8
// value or an fp16 scale.
inline void CopyCheckpointWithRawElement(const std::string& src_dir, const std::string& dst_dir,
                                         const std::string& name, int64_t flat, const void* bytes) {
  CopyCheckpoint(src_dir, dst_dir, [&](const TensorInfo& t, TensorCopy& c) {
    if (t.name == name) std::memcpy(c.bytes.data() + flat * DTypeSize(c.dtype), bytes, DTypeSize(c.dtype));
  });
}

// Copies a one-file checkpoint with element `flat` of tensor `name` (F32 or
// BF16) set to `value`.
inline void CopyCheckpointWithValue(const std::string& src_dir, const std::string& dst_dir, const std::string& name,
                                    int64_t flat, float value) {
  CopyCheckpoint(src_dir, dst_dir, [&](const TensorInfo& t, TensorCopy& c) {
    if (t.name != name) return;
    uint8_t* at = c.bytes.data() + static_cast<size_t>(flat) * DTypeSize(c.dtype);
    if (c.dtype == DType::kBF16) {
      const BF16 b = ToBF16(value);
      std::memcpy(at, &b.bits, sizeof(b.bits));
    } else {
      std::memcpy(at, &value, sizeof(value));
    }
  });
}

// Copies a one-file checkpoint with every quantizable tensor of its layers'
// tensor table (the Linear projections [out, in] of the config's layer
// family) replaced by its Q8 round trip DequantizeQ8(QuantizeQ8(w)), stored as
// F32 (exact): the dense model that int8 weights must equal (kda/kernels/q8.h).
inline void WriteDequantizedCheckpoint(const std::string& src_dir, const std::string& dst_dir) {
  const ModelConfig config = LoadModelConfig(src_dir);
  const LayerFamily& family = LayerFamilyFor(config.model_type);
  const TensorTable table = family.tensors(family.geometry(config));
  std::vector<std::string> prefixes;
  {
    const Checkpoint ckpt = Checkpoint::Open(src_dir);
    for (int layer : config.linear_layers) prefixes.push_back(LayerKeyPrefix(ckpt, family, layer));
  }
  CopyCheckpoint(src_dir, dst_dir, [&](const TensorInfo& t, TensorCopy& c) {
    const std::string& n = t.name;
    bool quantizable = false;
    for (const std::string& pre : prefixes) {
      for (const TensorSpec& spec : table) quantizable = quantizable || (spec.quantizable && n == pre + spec.name);
    }
    if (!quantizable) return;
    const std::vector<float> w = DequantizeQ8(QuantizeQ8(ToFloatVector(t), t.shape[0], t.shape[1], n));
    c.dtype = DType::kF32;
    c.bytes.resize(w.size() * sizeof(float));
    std::memcpy(c.bytes.data(), w.data(), c.bytes.size());
  });
}

}  // namespace kda::testing
