#include "kda/io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include <nlohmann/json.hpp>

#include "io/util.h"
#include "kda/base/error.h"

namespace kda {
namespace {

namespace fs = std::filesystem;

// A shard must name a file directly inside the model directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name.find('/') == std::string::npos && name.find("..") == std::string::npos &&
         name.find('\0') == std::string::npos;
}

bool IsRegularFile(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

}  // namespace

Checkpoint Checkpoint::Open(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  Checkpoint checkpoint;
  checkpoint.dir_ = model_dir;

  if (IsRegularFile(index_path)) {
    const std::string origin = index_path.string();
    const nlohmann::json root = io_internal::ParseJsonNoDuplicates(io_internal::ReadFile(origin), origin, "index");
    Check(root.is_object(), origin + ": index is not a JSON object");
    const auto weight_map = root.find("weight_map");
    Check(weight_map != root.end(), origin + ": missing weight_map");
    Check(weight_map->is_object(), origin + ": weight_map is not a JSON object");

    std::map<std::string, size_t> shard_index;  // shard file name -> index in shards_
    for (const auto& [name, shard] : weight_map->items()) {
      const std::string where = origin + ": weight_map entry for tensor '" + name + "'";
      Check(shard.is_string(), where + " is not a string");
      const std::string file = shard.get<std::string>();
      Check(IsPlainFileName(file),
            where + ": shard name '" + file + "' is not a plain file name in the model directory");
      auto it = shard_index.find(file);
      if (it == shard_index.end()) {
        const fs::path shard_path = dir / file;
        Check(IsRegularFile(shard_path),
              where + ": shard file " + shard_path.string() + " does not exist or is not a regular file");
        checkpoint.shards_.push_back(SafetensorsFile::Open(shard_path.string()));
        it = shard_index.emplace(file, checkpoint.shards_.size() - 1).first;
      }
      Check(checkpoint.shards_[it->second].Has(name),
            origin + ": tensor '" + name + "' is listed in shard '" + file + "' but missing from it");
      checkpoint.shard_of_.emplace(name, it->second);
    }
  } else if (IsRegularFile(single_path)) {
    checkpoint.shards_.push_back(SafetensorsFile::Open(single_path.string()));
    for (const TensorInfo& tensor : checkpoint.shards_[0].tensors()) checkpoint.shard_of_.emplace(tensor.name, 0);
  } else {
    throw Error("no model.safetensors or model.safetensors.index.json in " + model_dir);
  }
  return checkpoint;
}

bool Checkpoint::Has(const std::string& name) const { return shard_of_.count(name) != 0; }

const TensorInfo& Checkpoint::Get(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) throw Error("tensor '" + name + "' not found in checkpoint " + dir_);
  return shards_[it->second].Get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> result;
  result.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) result.push_back(name);
  std::sort(result.begin(), result.end());
  return result;
}

}  // namespace kda
