// What the families' entries are written with (models/families/families.h): the entry and the tensor-table
// builders.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "models/families/families.h"

namespace kda::families {
namespace {

TensorInit Normal(float sd) { return {TensorInit::Kind::kNormal, sd}; }

}  // namespace

LayerFamily Family(std::string layer_class, std::vector<ModelTypeName> model_types, std::string layer_prefix,
                   const DeltaRuleGeometry& reference, ModelConfig (*read_config)(const io_internal::ConfigFields&),
                   DeltaRuleGeometry (*geometry)(const ModelConfig&), TensorTable (*tensors)(const DeltaRuleGeometry&),
                   std::string description) {
  LayerFamily f;
  f.layer_class = std::move(layer_class);
  f.description = std::move(description);
  f.model_types = std::move(model_types);
  f.layer_prefix = std::move(layer_prefix);
  f.reference = reference;
  f.read_config = read_config;
  f.geometry = geometry;
  f.tensors = tensors;
  return f;
}

TensorSpec Projection(const std::string& name, int64_t rows, int64_t cols, Parts parts, float sd, bool interleaved) {
  TensorSpec t;
  t.name = name;
  t.shapes = {{rows, cols}};
  t.cols = cols;
  t.shard = ShardAxis::kRows;
  t.parts = std::move(parts);
  t.interleaved = interleaved;
  t.quantizable = true;
  t.init = Normal(sd);
  return t;
}

TensorSpec LowRankDown(const std::string& name, int64_t rows, int64_t cols, TensorRole role, float sd) {
  TensorSpec t = Projection(name, rows, cols, {{0, role}}, sd);
  t.shard = ShardAxis::kNone;
  return t;
}

TensorSpec Conv(const std::string& name, int64_t rows, int64_t W, Parts parts, const std::string& group) {
  TensorSpec t;
  t.name = name;
  t.shapes = {{rows, 1, W}, {rows, W}};
  t.cols = W;
  t.shard = ShardAxis::kRows;
  t.parts = std::move(parts);
  t.init = Normal(0.5F);
  t.group = group;
  return t;
}

TensorSpec ALog(std::vector<std::vector<int64_t>> shapes, int64_t units) {
  TensorSpec t;
  t.name = "A_log";
  t.shapes = std::move(shapes);
  t.shard = ShardAxis::kRows;
  t.parts = {{units, TensorRole::kALog}};
  t.init = {TensorInit::Kind::kUniform, 0.0F, std::log(16.0F)};
  return t;
}

TensorSpec DtBias(int64_t rows, int64_t units) {
  TensorSpec t;
  t.name = "dt_bias";
  t.shapes = {{rows}};
  t.shard = ShardAxis::kRows;
  t.parts = {{units, TensorRole::kDtBias}};
  t.init = {TensorInit::Kind::kDtBias, std::log(1e-3F), std::log(1e-1F)};
  return t;
}

TensorSpec Norm(const std::string& name, int64_t V) {
  TensorSpec t;
  t.name = name;
  t.shapes = {{V}};
  t.parts = {{0, TensorRole::kNorm}};
  t.init = {TensorInit::Kind::kUniform, 0.5F, 1.5F};
  return t;
}

TensorSpec OutProj(const std::string& name, int64_t hidden, int64_t cols, int64_t units) {
  TensorSpec t = Projection(name, hidden, cols, {{units, TensorRole::kOut}}, 0.02F);
  t.shard = ShardAxis::kCols;
  return t;
}

TensorSpec ConvBias(const std::string& name, int64_t rows, Parts parts) {
  TensorSpec t;
  t.name = name;
  t.shapes = {{rows}};
  t.shard = ShardAxis::kRows;
  t.parts = std::move(parts);
  t.init = Normal(0.1F);
  t.conv_bias = true;
  return t;
}

TensorSpec HeadParam(const std::string& name, int64_t rows, int64_t units, TensorRole role, float a, float b) {
  TensorSpec t;
  t.name = name;
  t.shapes = {{rows}};
  t.shard = ShardAxis::kRows;
  t.parts = {{units, role}};
  t.init = {TensorInit::Kind::kUniform, a, b};
  return t;
}

}  // namespace kda::families
