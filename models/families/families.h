// The registry's entries (models/families/*.cc, listed in models/layer_family.cc) and
// what they are written with: the geometry of each layer kind from a config,
// and the tensor-table builders. Internal to models/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/config_fields.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/models/layer_family.h"
#include "kda/models/layer_weights.h"

namespace kda::families {

// KDA: Kimi-Linear, GLM-5 Next, Bailing hybrid (kda_families.cc).
LayerFamily KimiLinear();
LayerFamily Glm5Next();
LayerFamily BailingHybrid();
// A config without model_type, read as Kimi-Linear's (its message for a missing linear_attn_config says so).
ModelConfig ReadUntypedKimiLinear(const io_internal::ConfigFields& fields);
// Gated DeltaNet: Qwen3-Next, Qwen3.5, OLMo hybrid, Lara-Mini, Qwen4-exp (gdn_families.cc).
LayerFamily Qwen3Next();
LayerFamily Qwen3_5();
LayerFamily OlmoHybrid();
LayerFamily LaraMini();
LayerFamily Qwen4Exp();
// Mamba2 mixers (the SSD layer, DeltaRuleGeometry::ssd): Mamba2 (Codestral), Nemotron-H, Granite-4.0-H,
// Bamba, Falcon-H1, Zamba2 (mamba2_families.cc).
LayerFamily Mamba2();
LayerFamily NemotronH();
LayerFamily GraniteMoeHybrid();
LayerFamily Bamba();
LayerFamily FalconH1();
LayerFamily Zamba2();

// An entry of the registry (see LayerFamily's fields).
LayerFamily Family(std::string layer_class, std::vector<ModelTypeName> model_types, std::string layer_prefix,
                   const DeltaRuleGeometry& reference, ModelConfig (*read_config)(const io_internal::ConfigFields&),
                   DeltaRuleGeometry (*geometry)(const ModelConfig&), TensorTable (*tensors)(const DeltaRuleGeometry&),
                   std::string description);

// The tensor table's entries, by kind. `parts`: the rows per key head of each part and its role.
using Parts = std::vector<TensorPart>;
// An input projection [rows, cols] (quantizable, cut by rows), N(0, sd); `interleaved` by key head.
TensorSpec Projection(const std::string& name, int64_t rows, int64_t cols, Parts parts, float sd,
                      bool interleaved = false);
// A low-rank projection's first half [rows, cols] (quantizable, replicated), N(0, sd).
TensorSpec LowRankDown(const std::string& name, int64_t rows, int64_t cols, TensorRole role, float sd);
// Depthwise conv weights [rows, 1, W] (or [rows, W]), N(0, 0.5); `group`: see TensorSpec::group (the q, k
// and v convs apart are the rows of one conv1d).
TensorSpec Conv(const std::string& name, int64_t rows, int64_t W, Parts parts, const std::string& group = "");
// A_log (shapes as the checkpoints hold it) = log(U[1, 16]); dt_bias [rows] = softplus^-1(dt), dt
// log-uniform in [1e-3, 1e-1].
TensorSpec ALog(std::vector<std::vector<int64_t>> shapes, int64_t units);
TensorSpec DtBias(int64_t rows, int64_t units);
// The gated norm's weight [V] (replicated), U[0.5, 1.5).
TensorSpec Norm(const std::string& name, int64_t V);
// The output projection [hidden, cols] (quantizable, cut by columns, `units` per key head).
TensorSpec OutProj(const std::string& name, int64_t hidden, int64_t cols, int64_t units);
// A conv's bias [rows] (parts: the conv channels' roles), N(0, 0.1).
TensorSpec ConvBias(const std::string& name, int64_t rows, Parts parts);
// A per-head parameter [rows] of `role` (`units` per key head), U[a, b) (Mamba2's D: U[0.5, 1.5)).
TensorSpec HeadParam(const std::string& name, int64_t rows, int64_t units, TensorRole role, float a, float b);

}  // namespace kda::families
