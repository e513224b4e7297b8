#include "tools/run_input.h"

#include <cstdint>
#include <string>

#include "kda/base/error.h"

namespace kda::cli {
namespace {

void ExpectShape(const TensorInfo& t, const std::vector<int64_t>& want) {
  Check(t.shape == want,
        "input tensor " + t.name + " has shape " + ShapeString(t.shape) + ", expected " + ShapeString(want));
}

std::vector<int64_t> CheckedCuSeqlens(const TensorInfo& t, int64_t T) {
  Check(t.shape.size() == 1 && t.shape[0] >= 2,
        "input tensor cu_seqlens must be 1-D with at least 2 entries, got shape " + ShapeString(t.shape));
  Check(t.dtype == DType::kI32 || t.dtype == DType::kI64,
        std::string("input tensor cu_seqlens has dtype ") + DTypeName(t.dtype) + ", expected I32 or I64");
  std::vector<int64_t> cu = ToInt64Vector(t);
  Check(cu.front() == 0, "cu_seqlens must start at 0, got " + std::to_string(cu.front()));
  for (size_t i = 1; i < cu.size(); ++i) {
    Check(cu[i] >= cu[i - 1], "cu_seqlens must be non-decreasing (entry " + std::to_string(i) + ")");
  }
  Check(cu.back() == T, "cu_seqlens must end at T = " + std::to_string(T) + ", got " + std::to_string(cu.back()));
  return cu;
}

// The tensor's values as float, all finite.
std::vector<float> FiniteFloats(const TensorInfo& t) {
  std::vector<float> v = ToFloatVector(t);
  CheckAllFinite(v.data(), static_cast<int64_t>(v.size()), t.shape, "input tensor " + t.name);
  return v;
}

}  // namespace

RunInput ReadRunInput(const SafetensorsFile& in, const DeltaRuleGeometry& shape) {
  Check(in.Has("hidden_states"), "input file has no hidden_states tensor");
  Check(in.Has("cu_seqlens"), "input file has no cu_seqlens tensor");
  const TensorInfo& xs = in.Get("hidden_states");
  Check(xs.dtype == DType::kF32 || xs.dtype == DType::kBF16,
        std::string("input tensor hidden_states has dtype ") + DTypeName(xs.dtype) + ", expected F32 or BF16");
  Check(xs.shape.size() == 2 && xs.shape[1] == shape.hidden, "input tensor hidden_states has shape " +
                                                                 ShapeString(xs.shape) + ", expected [T, " +
                                                                 std::to_string(shape.hidden) + "]");
  RunInput r;
  r.T = xs.shape[0];
  r.cu = CheckedCuSeqlens(in.Get("cu_seqlens"), r.T);
  r.N = static_cast<int64_t>(r.cu.size()) - 1;

  const TensorInfo* rec = nullptr;
  const TensorInfo* conv = nullptr;
  if (in.Has("initial_recurrent_state")) {
    rec = &in.Get("initial_recurrent_state");
    Check(rec->dtype == DType::kF32, "input tensor initial_recurrent_state must be F32");
    const auto dims = shape.state_dims();
    ExpectShape(*rec, {r.N, dims[0], dims[1], dims[2]});
  }
  if (in.Has("initial_conv_state")) {
    conv = &in.Get("initial_conv_state");
    Check(conv->dtype == DType::kF32 || conv->dtype == DType::kBF16,
          "input tensor initial_conv_state must be F32 or BF16");
    ExpectShape(*conv, {r.N, shape.W - 1, shape.conv_channels()});
  }
  const TensorInfo* ids = nullptr;
  if (in.Has("input_ids")) {
    ids = &in.Get("input_ids");
    Check(ids->dtype == DType::kI32 || ids->dtype == DType::kI64,
          std::string("input tensor input_ids has dtype ") + DTypeName(ids->dtype) + ", expected I32 or I64");
    ExpectShape(*ids, {r.T});
  }
  // Values last: every shape and dtype problem is reported before any is read.
  if (ids != nullptr) {
    const std::vector<int64_t> v = ToInt64Vector(*ids);
    r.ids.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      Check(v[i] >= INT32_MIN && v[i] <= INT32_MAX, [&] {
        return "input tensor input_ids has a value out of the int32 range (" + std::to_string(v[i]) + ") at element " +
               std::to_string(i);
      });
      r.ids.push_back(static_cast<int32_t>(v[i]));
    }
  }
  r.x = FiniteFloats(xs);
  if (rec != nullptr) r.rec = FiniteFloats(*rec);
  if (conv != nullptr) r.conv = FiniteFloats(*conv);
  return r;
}

}  // namespace kda::cli
