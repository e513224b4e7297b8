// `kda quantize`: an int8 checkpoint written from a Hugging Face one
// (models/kimi_linear/quantize.cc; the Q8 format of kda/kernels/q8.h).
#pragma once

#include <string>

namespace kda {

// `kda quantize`: writes output_dir (config.json copied, model.safetensors)
// with every KDA layer of the checkpoint in model_dir: each projection as
// `model.layers.{i}.self_attn.{name}.weight` (I8 [out, in]) and
// `...{name}.weight_scale` (F16 [out, in / 32]), the other KDA tensors as
// they are. Other layers' tensors are not written. kda::Error (nothing
// written) when output_dir exists and is not empty, and as QuantizeQ8.
void QuantizeKdaCheckpoint(const std::string& model_dir, const std::string& output_dir);

}  // namespace kda
