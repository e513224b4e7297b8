// Fuzzes the sharded-checkpoint index (model.safetensors.index.json) through Checkpoint::Open. The model
// directory holds two valid shards (a.safetensors: x, y; b.safetensors: z); the input is the index text,
// run-length macros expanded (see fuzz_util.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/safetensors.h"

namespace {

// The model directory with its two shards, made once per process and removed at exit.
struct ModelDir {
  ModelDir() {
    const float x[2] = {1.0F, 2.0F};
    const int64_t y[1] = {7};
    const float z[3] = {0.5F, -0.5F, 3.0F};
    kda::WriteSafetensors((dir.path() / "a.safetensors").string(),
                          {{"x", kda::DType::kF32, {2}, x}, {"y", kda::DType::kI64, {1}, y}});
    kda::WriteSafetensors((dir.path() / "b.safetensors").string(), {{"z", kda::DType::kF32, {3, 1}, z}});
  }
  kda::fuzz::TempDir dir;
};

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return kda::fuzz::MutateWithMacros(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelDir model;
  const kda::fuzz::TempDir& dir = model.dir;
  const std::string index = kda::fuzz::Expand(data, size);
  {
    std::ofstream out(dir.path() / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(index.data(), static_cast<std::streamsize>(index.size()));
    if (!out) std::abort();
  }
  try {
    const kda::Checkpoint ckpt = kda::Checkpoint::Open(dir.path().string());
    // Every tensor the index listed is reachable.
    for (const std::string& name : ckpt.names()) {
      if (!ckpt.Has(name) || ckpt.Get(name).name != name) std::abort();
    }
  } catch (const kda::Error&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
