// `kda quantize`: a checkpoint's delta-rule layers with Q8 projections (kda/kernels/q8.h),
// written once so that loading does not quantize.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/delta_rule_model.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"
#include "kda/models/quantize.h"

namespace kda {

void QuantizeCheckpoint(const std::string& model_dir, const std::string& output_dir) {
  namespace fs = std::filesystem;
  Check(!output_dir.empty(), "kda quantize: --output is required");
  std::error_code ec;
  Check(!fs::exists(output_dir, ec) || fs::is_empty(output_dir, ec),
        "kda quantize: output directory " + output_dir + " exists and is not empty");
  const ModelConfig config = LoadModelConfig(model_dir);
  const LayerFamily& family = LayerFamilyFor(config.model_type);
  const DeltaRuleGeometry geometry = family.geometry(config);
  geometry.Validate("config.json in " + model_dir);
  const TensorTable table = family.tensors(geometry);
  const Checkpoint ckpt = Checkpoint::Open(model_dir);
  const HeadShard whole = MakeHeadShard(geometry.H, 0, 1);

  // Everything is built in memory first (checked and quantized), then written.
  std::vector<Q8Weight> q8;  // kept alive until written
  q8.reserve(config.linear_layers.size() * table.size());
  std::vector<TensorToWrite> tensors;
  for (int layer : config.linear_layers) {
    const std::string pre = LayerKeyPrefix(ckpt, family, layer);
    const LayerWeights w = LoadLayerWeights(ckpt, pre, table, whole);  // checks shapes, dtypes, finite values
    Check(w.q8.empty(), "kda quantize: " + model_dir + " already holds int8 weights");
    for (const TensorSpec& spec : table) {
      const std::string key = pre + spec.name;
      if (!spec.quantizable) {
        const TensorInfo& t = ckpt.Get(key);
        tensors.push_back({key, t.dtype, t.shape, t.data});
        continue;
      }
      q8.push_back(QuantizeQ8(w.Dense(spec.name), spec.rows(), spec.cols, key));
      const Q8Weight& qw = q8.back();
      tensors.push_back({key, DType::kI8, {qw.rows, qw.cols}, qw.q.data()});
      tensors.push_back({key + "_scale", DType::kF16, {qw.rows, qw.blocks_per_row()}, qw.scales.data()});
    }
  }

  // Written into a sibling directory, then renamed: output_dir is either
  // untouched or complete.
  const fs::path out(output_dir);
  const fs::path tmp = out.string() + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    fs::copy_file(fs::path(model_dir) / "config.json", tmp / "config.json");
    fs::permissions(tmp / "config.json", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
    WriteSafetensors((tmp / "model.safetensors").string(), tensors,
                     {{"format", "pt"}, {"kda_quantization", "q8_0"}, {"source", model_dir}});
    if (fs::exists(out)) fs::remove(out);  // empty (checked above)
    fs::rename(tmp, out);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw Error(std::string("kda quantize: cannot write ") + output_dir + ": " + e.code().message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace kda
