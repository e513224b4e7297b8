// `kda quantize`: an int8 checkpoint written from a Hugging Face one
// (models/quantize.cc; the Q8 format of kda/kernels/q8.h).
#pragma once

#include <string>

namespace kda {

// `kda quantize`: writes output_dir (config.json copied, model.safetensors)
// with every delta-rule layer of the checkpoint in model_dir, of any
// supported model type: each quantizable tensor of the layer's tensor table
// (the projections) as `{key}` (I8 [out, in]) and `{key}_scale` (F16
// [out, in / 32]), its other tensors as they are. Other layers' tensors are
// not written. kda::Error (nothing written) when output_dir exists and is not
// empty, and as QuantizeQ8.
void QuantizeCheckpoint(const std::string& model_dir, const std::string& output_dir);

}  // namespace kda
