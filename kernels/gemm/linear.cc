#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/gemm.h"

namespace kda {
namespace {

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

}  // namespace

constexpr size_t kMaxCachedPrimitives = 64;

bool CpuHasBF16Dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") != 0;
  return has;
}

// The weight lives in a oneDNN memory object viewed as [K, N] with strides
// {1, K}: the transpose of the [N, K] row-major Linear weight, no copy.
// Primitives are created once per row count M and cached.
struct Linear::Impl {
  dnnl::memory::data_type compute_type = dnnl::memory::data_type::f32;
  std::vector<float> w_f32;  // used when compute_type is f32
  std::vector<BF16> w_bf16;  // used when compute_type is bf16
  dnnl::memory weights;
  mutable std::mutex mu;
  mutable std::map<std::pair<int64_t, bool>, dnnl::matmul> primitives;  // (rows, bf16 output)
};

Linear::Linear(const std::vector<float>& w, int64_t out_features, int64_t in_features, DType dtype)
    : out_(out_features), in_(in_features), dtype_(dtype), impl_(std::make_unique<Impl>()) {
  Check(out_features > 0 && in_features > 0, "Linear: empty weight");
  Check(static_cast<int64_t>(w.size()) == out_features * in_features, "Linear: weight size does not match its shape");
  Check(dtype == DType::kF32 || dtype == DType::kBF16, "Linear: dtype must be F32 or BF16");
  using dt = dnnl::memory::data_type;
  const dnnl::memory::dims wdims = {in_, out_};
  const dnnl::memory::dims wstrides = {1, in_};
  if (dtype == DType::kBF16 && CpuHasBF16Dot()) {
    impl_->compute_type = dt::bf16;
    impl_->w_bf16.resize(w.size());
    std::transform(w.begin(), w.end(), impl_->w_bf16.begin(), ToBF16);
    impl_->weights = dnnl::memory({wdims, dt::bf16, wstrides}, CpuEngine(), impl_->w_bf16.data());
  } else {
    impl_->compute_type = dt::f32;
    impl_->w_f32 = w;
    if (dtype == DType::kBF16) {
      for (float& x : impl_->w_f32) x = RoundBF16(x);
    }
    impl_->weights = dnnl::memory({wdims, dt::f32, wstrides}, CpuEngine(), impl_->w_f32.data());
  }
}

Linear::~Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;

void Linear::Forward(MutBuf y, ConstBuf x, int64_t m) const {
  Check(x.dtype == dtype_,
        std::string("Linear: input dtype ") + DTypeName(x.dtype) + " does not match weight dtype " + DTypeName(dtype_));
  Check(y.dtype == DType::kF32 || y.dtype == dtype_, "Linear: output dtype must be F32 or the weight dtype");
  Check(m >= 0, "Linear: negative row count");
  if (m == 0) return;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dt ct = impl_->compute_type;

  // Inputs in the compute type (widened to fp32 where the CPU has no bf16 dot).
  std::vector<float> x_wide;
  const void* src_ptr = x.data;
  if (ct == dt::f32 && x.dtype == DType::kBF16) {
    x_wide.resize(static_cast<size_t>(m * in_));
    ConvertToFloat(x_wide.data(), static_cast<const BF16*>(x.data), m * in_);
    src_ptr = x_wide.data();
  }
  // The fp32 accumulation is rounded once when y is BF16: by oneDNN's
  // round-to-nearest-even store where it computes in bf16, else below.
  const bool native_bf16_out = y.dtype == DType::kBF16 && ct == dt::bf16;
  std::vector<float> acc;
  void* dst_ptr = y.data;
  if (y.dtype == DType::kBF16 && !native_bf16_out) {
    acc.resize(static_cast<size_t>(m * out_));
    dst_ptr = acc.data();
  }

  dnnl::matmul prim;
  const dnnl::memory::desc src_md({m, in_}, ct, tag::ab);
  const dnnl::memory::desc dst_md({m, out_}, native_bf16_out ? dt::bf16 : dt::f32, tag::ab);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const std::pair<int64_t, bool> key(m, native_bf16_out);
    auto it = impl_->primitives.find(key);
    if (it == impl_->primitives.end()) {
      // A serving loop sees many row counts: keep the cache bounded.
      if (impl_->primitives.size() >= kMaxCachedPrimitives) impl_->primitives.clear();
      const dnnl::matmul::desc desc(src_md, impl_->weights.get_desc(), dst_md);
      const dnnl::matmul::primitive_desc pd(desc, CpuEngine());
      it = impl_->primitives.emplace(key, dnnl::matmul(pd)).first;
    }
    prim = it->second;
  }
  dnnl::memory src(src_md, CpuEngine(), const_cast<void*>(src_ptr));  // NOLINT: oneDNN takes void*
  dnnl::memory dst(dst_md, CpuEngine(), dst_ptr);
  dnnl::stream stream(CpuEngine());
  prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, impl_->weights}, {DNNL_ARG_DST, dst}});
  stream.wait();

  if (y.dtype == DType::kBF16 && !native_bf16_out) {
    ConvertToBF16(static_cast<BF16*>(y.data), acc.data(), m * out_);
  }
}

}  // namespace kda
