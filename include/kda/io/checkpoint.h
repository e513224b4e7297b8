// A Hugging Face checkpoint directory: one model.safetensors, or shards listed by model.safetensors.index.json.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "kda/io/safetensors.h"

namespace kda {

// The tensors of a checkpoint directory, each shard memory-mapped once. Movable, not copyable.
class Checkpoint {
 public:
  // With MODEL_DIR/model.safetensors.index.json: its "weight_map" (tensor name -> shard file name, a plain file name
  // in MODEL_DIR) gives the tensors, and every listed tensor must be in its shard. Otherwise all tensors of
  // MODEL_DIR/model.safetensors. Neither file present, or any problem with them, is a kda::Error.
  static Checkpoint Open(const std::string& model_dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  bool Has(const std::string& name) const;
  // Throws kda::Error naming the tensor and the directory when absent.
  const TensorInfo& Get(const std::string& name) const;
  // The names of all tensors, sorted.
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  std::unordered_map<std::string, size_t> shard_of_;  // tensor name -> index in shards_
};

}  // namespace kda
