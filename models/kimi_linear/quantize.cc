// `kda quantize`: a checkpoint's KDA layers with Q8 projections (kda/kernels/q8.h),
// written once so that loading does not quantize.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "kda/base/error.h"
#include "kda/io/checkpoint.h"
#include "kda/io/config.h"
#include "kda/io/safetensors.h"
#include "kda/kernels/q8.h"
#include "kda/models/quantize.h"
#include "kda/models/weights.h"

namespace kda {

void QuantizeKdaCheckpoint(const std::string& model_dir, const std::string& output_dir) {
  namespace fs = std::filesystem;
  Check(!output_dir.empty(), "kda quantize: --output is required");
  std::error_code ec;
  Check(!fs::exists(output_dir, ec) || fs::is_empty(output_dir, ec),
        "kda quantize: output directory " + output_dir + " exists and is not empty");
  const KimiLinearConfig config = LoadKimiLinearConfig(model_dir);
  const Checkpoint ckpt = Checkpoint::Open(model_dir);
  const KdaLayerShape shape = KdaLayerShapeFromConfig(config);
  const int64_t hid = shape.hidden;
  const int64_t p = shape.P();
  const int64_t k = shape.K;

  // Everything is built in memory first (checked and quantized), then written.
  std::vector<Q8Weight> q8;  // kept alive until written
  std::vector<std::pair<std::string, const TensorInfo*>> copied;
  q8.reserve(config.kda_layers.size() * KdaProjectionNames().size());
  for (int layer : config.kda_layers) {
    const KdaLayerWeights w = LoadKdaLayerWeights(ckpt, config, layer);  // checks shapes, dtypes, finite values
    Check(!w.q8, "kda quantize: " + model_dir + " already holds int8 weights");
    const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
    const std::vector<std::pair<const std::vector<float>*, std::pair<int64_t, int64_t>>> projs = {
        {&w.q_proj, {p, hid}},   {&w.k_proj, {p, hid}}, {&w.v_proj, {p, hid}},
        {&w.f_a_proj, {k, hid}}, {&w.f_b_proj, {p, k}}, {&w.b_proj, {shape.H, hid}},
        {&w.g_a_proj, {k, hid}}, {&w.g_b_proj, {p, k}}, {&w.o_proj, {hid, p}}};
    for (size_t i = 0; i < projs.size(); ++i) {
      const auto& [values, dims] = projs[i];
      q8.push_back(QuantizeQ8(*values, dims.first, dims.second, pre + KdaProjectionNames()[i] + ".weight"));
    }
    for (const char* name :
         {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "A_log", "dt_bias", "o_norm.weight"}) {
      copied.emplace_back(pre + name, &ckpt.Get(pre + name));
    }
  }
  std::vector<TensorToWrite> tensors;
  size_t qi = 0;
  size_t ci = 0;
  for (int layer : config.kda_layers) {
    const std::string pre = "model.layers." + std::to_string(layer) + ".self_attn.";
    for (const std::string& name : KdaProjectionNames()) {
      const Q8Weight& w = q8[qi++];
      tensors.push_back({pre + name + ".weight", DType::kI8, {w.rows, w.cols}, w.q.data()});
      tensors.push_back({pre + name + ".weight_scale", DType::kF16, {w.rows, w.blocks_per_row()}, w.scales.data()});
    }
    for (int j = 0; j < 6; ++j, ++ci) {
      const TensorInfo& t = *copied[ci].second;
      tensors.push_back({copied[ci].first, t.dtype, t.shape, t.data});
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
