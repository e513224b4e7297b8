#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <tuple>
#include <utility>

#include "base/scratch.h"
#include "kda/base/error.h"
#include "kda/base/parallel.h"
#include "kda/kernels/cpu_probe.h"
#include "kda/kernels/elementwise.h"
#include "kda/kernels/gemm_route.h"
#include "kda/kernels/linear.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/isa/dispatch.h"

namespace kda {
namespace {

dnnl::engine& CpuEngine() {
  // oneDNN fixes its instruction set at its first primitive: the GEMM
  // engines are found (and the tiles kept off where KDA_GEMM_ROUTE rules
  // them out) before.
  static dnnl::engine engine = [] {
    internal::FindGemmEngines();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

}  // namespace

namespace internal {

std::string OneDnnTileImplementation() {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  try {
    // A shape oneDNN 2.6's brgemm puts on the tiles where it can.
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc src({64, 64}, dt::bf16, tag::ab);
    const dnnl::memory::desc w({64, 64}, dt::bf16, dnnl::memory::dims{1, 64});
    const dnnl::memory::desc dst({64, 64}, dt::bf16, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, w, dst), engine);
    do {
      std::string impl = pd.impl_info_str();
      if (impl.find("amx") != std::string::npos) return impl;
    } while (pd.next_impl());
  } catch (const dnnl::error&) {
    return "";
  }
  return "";
}

// (The tile code rounds Q8 weights to bf16 with AVX512-BF16, which every CPU with AMX-BF16 has.)
bool TileGemmRuns() {
  return AmxTilesGranted() && CanRunProbe(ProbeInstruction::kBf16Dot) && ActiveKernels().tile_gemm_rows != nullptr;
}

namespace {

// The weight rows of one TileGemm job (gemm_internal.h): as many as kTileGemmJobBytes hold, fewer
// where that splits the rows evenly between the threads.
int64_t TileJobRows(const TileGemmArgs& a) {
  constexpr int64_t kPair = 32;  // rows of two tiles
  const int64_t most = std::clamp(kTileGemmJobBytes / (a.k * static_cast<int64_t>(sizeof(BF16))) / kPair * kPair, kPair,
                                  kTileGemmJobRows);
  const int64_t threads = NumThreads();
  for (int64_t rows = most; rows > most / 2; rows -= kPair) {
    if ((a.n + rows - 1) / rows % threads == 0) return rows;
  }
  return most;
}

}  // namespace

void TileGemm(const TileGemmArgs& a, const BF16* x, const BF16* w, const Q8Weight* q8) {
  const KernelTable& kernels = ActiveKernels();
  Check(TileGemmRuns(), "TileGemm: the AMX tiles are not available to this process");
  Check(a.k > 0 && a.k % kTileGemmDepth == 0, "TileGemm: the input dim must be a positive multiple of 32");
  Check(a.m > 0 && a.n > 0 && a.ldy >= a.n, "TileGemm: bad shape");
  Check((a.y_f32 == nullptr) != (a.y_bf16 == nullptr), "TileGemm: exactly one output");
  Check((w == nullptr) != (q8 == nullptr), "TileGemm: exactly one weight");
  constexpr int64_t kRows = 16;  // a tile's rows
  const int64_t blocks = (a.m + kRows - 1) / kRows;
  ScratchArray<BF16> xp(static_cast<size_t>(blocks * kRows * a.k));
  ParallelFor(blocks, [&](int64_t b) { kernels.tile_pack_rows(xp.data(), x, a.m, a.k, b); });
  TileGemmArgs args = a;
  // Even spans of at most kTileGemmSpanRows rows, each a multiple of 32.
  const int64_t spans = (a.m + kTileGemmSpanRows - 1) / kTileGemmSpanRows;
  args.span = ((a.m + spans - 1) / spans + 2 * kRows - 1) / (2 * kRows) * (2 * kRows);
  const int64_t span_blocks = args.span / kRows;
  // Jobs of weight rows by groups of spans: the spans split between the threads only where the
  // weight has too few rows to keep every thread busy (the low-rank and gate projections).
  const int64_t job_rows = TileJobRows(a);
  const int64_t row_jobs = (a.n + job_rows - 1) / job_rows;
  const int64_t span_count = (blocks + span_blocks - 1) / span_blocks;
  const int64_t groups = std::min(span_count, std::max<int64_t>(1, NumThreads() / row_jobs));
  const int64_t spans_per_group = (span_count + groups - 1) / groups;
  ParallelFor(row_jobs * groups, [&](int64_t job) {
    const int64_t r0 = job / groups * job_rows;
    const int64_t r1 = std::min(a.n, r0 + job_rows);
    const int64_t padded = (r1 - r0 + 2 * kRows - 1) / (2 * kRows) * (2 * kRows);
    TileGemmJob j;
    j.r0 = r0;
    j.r1 = r1;
    j.b0 = job % groups * spans_per_group * span_blocks;
    j.b1 = std::min(blocks, j.b0 + spans_per_group * span_blocks);
    if (j.b0 >= j.b1) return;
    ScratchArray<float> acc(static_cast<size_t>(padded * args.span));
    j.acc = acc.data();
    if (q8 == nullptr && padded == r1 - r0) {
      j.w = w + r0 * a.k;
      kernels.tile_gemm_rows(args, j, xp.data());
      return;
    }
    if (q8 != nullptr && j.b1 - j.b0 <= span_blocks) {
      // Q8 rows of one span: each weight is used once, so each pair of weight tiles is dequantized
      // just before its products (from L1 and L2) while the next pair's bytes come from memory.
      ScratchArray<BF16> pair(static_cast<size_t>(TileGemmQ8PairValues(a.k)));
      j.q = q8->q.data() + r0 * a.k;
      j.scales = q8->scales.data() + r0 * (a.k / kQ8Block);
      j.pair = pair.data();
      kernels.tile_gemm_rows(args, j, xp.data());
      return;
    }
    // Q8 rows dequantized (to the bf16 pipeline's weights), and the last rows of a weight whose
    // rows are no multiple of 32 copied, into a panel padded with zero rows (a tile reads 16).
    ScratchArray<BF16> panel(static_cast<size_t>(padded * a.k));
    if (q8 != nullptr) {
      kernels.q8_dequant_bf16(panel.data(), q8->q.data() + r0 * a.k, q8->scales.data() + r0 * (a.k / kQ8Block), a.k, 0,
                              r1 - r0);
    } else {
      std::memcpy(panel.data(), w + r0 * a.k, static_cast<size_t>((r1 - r0) * a.k) * sizeof(BF16));
    }
    std::fill(panel.data() + (r1 - r0) * a.k, panel.data() + padded * a.k, BF16{});
    j.w = panel.data();
    kernels.tile_gemm_rows(args, j, xp.data());
  });
}

void CapOneDnnBelowTiles() { dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16); }

}  // namespace internal

constexpr size_t kMaxCachedPrimitives = 64;

// The GEMM views the [N, K] row-major Linear weight as [K, N] with strides
// {1, K}: its transpose, no copy. Primitives are created once per shape and
// cached.
struct Linear::Impl {
  AlignedVector<float> w_f32;  // an F32 Linear's dense weights
  AlignedVector<BF16> w_bf16;  // a BF16 Linear's dense weights
  Q8Weight q8;                 // Q8 weights
  mutable std::mutex mu;
  // (rows, output columns, route, bf16 output): Q8 and widened bf16 weights
  // run tiles of the columns.
  using PrimitiveKey = std::tuple<int64_t, int64_t, GemmRoute, bool>;
  mutable std::map<PrimitiveKey, dnnl::matmul> primitives;
};

Linear::Linear(const std::vector<float>& w, int64_t out_features, int64_t in_features, DType dtype)
    : out_(out_features), in_(in_features), dtype_(dtype), impl_(std::make_unique<Impl>()) {
  Check(out_features > 0 && in_features > 0, "Linear: empty weight");
  Check(static_cast<int64_t>(w.size()) == out_features * in_features, "Linear: weight size does not match its shape");
  Check(dtype == DType::kF32 || dtype == DType::kBF16, "Linear: dtype must be F32 or BF16");
  if (dtype == DType::kBF16) {
    impl_->w_bf16.resize(w.size());
    std::transform(w.begin(), w.end(), impl_->w_bf16.begin(), ToBF16);
  } else {
    impl_->w_f32.assign(w.begin(), w.end());
  }
}

Linear::Linear(Q8Weight w, DType dtype)
    : out_(w.rows), in_(w.cols), dtype_(dtype), format_(WeightFormat::kInt8), impl_(std::make_unique<Impl>()) {
  Check(dtype == DType::kF32 || dtype == DType::kBF16, "Linear: dtype must be F32 or BF16");
  CheckQ8Weight(w);
  impl_->q8 = std::move(w);
}

int64_t Linear::weight_bytes() const {
  if (format_ == WeightFormat::kInt8) return impl_->q8.bytes();
  return out_ * in_ * static_cast<int64_t>(DTypeSize(dtype_));
}

namespace {

// Output rows per job of the small-M kernels: a multiple of 4 (their register
// block).
constexpr int64_t kGemvRowsPerJob = 64;

}  // namespace

void Linear::ForwardSmall(MutBuf y, ConstBuf x, int64_t m, bool bf16_dot) const {
  const internal::KernelTable& kernels = internal::ActiveKernels();
  internal::GemvArgs a;
  if (format_ == WeightFormat::kInt8) {
    a.weights = internal::GemvWeights::kQ8;
    a.q = impl_->q8.q.data();
    a.scales = impl_->q8.scales.data();
    a.round_bf16 = dtype_ == DType::kBF16;
  } else if (dtype_ == DType::kBF16) {
    a.weights = internal::GemvWeights::kBF16;
    a.w_bf16 = impl_->w_bf16.data();
  } else {
    a.weights = internal::GemvWeights::kF32;
    a.w_f32 = impl_->w_f32.data();
  }
  // bf16 inputs: multiplied as they are by the bf16 dot, else widened to fp32
  // (exact) for fp32 FMA.
  ScratchArray<float> x_wide;
  const float* xf = static_cast<const float*>(x.data);
  if (x.dtype == DType::kBF16 && !bf16_dot) {
    x_wide = ScratchArray<float>(static_cast<size_t>(m * in_));
    ConvertToFloat(x_wide.data(), static_cast<const BF16*>(x.data), m * in_);
    xf = x_wide.data();
  }
  a.x = xf;
  a.bf16_dot = bf16_dot;
  if (bf16_dot) a.x_bf16 = static_cast<const BF16*>(x.data);
  a.m = m;
  a.n = out_;
  a.k = in_;
  internal::SetGemmOutput(a, y.data, y.dtype == DType::kBF16);
  const int64_t n = out_;
  ParallelFor((n + kGemvRowsPerJob - 1) / kGemvRowsPerJob,
              [&](int64_t job) { kernels.gemv(a, job * kGemvRowsPerJob, std::min(n, (job + 1) * kGemvRowsPerJob)); });
}

Linear::~Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;

namespace {

// Q8 weights at large M (and bf16 weights on the fp32 FMA route) are
// dequantized (widened) a tile of output rows at a time into a panel of about
// this many bytes per thread (each thread's share within its L2), which stays
// in cache until the GEMM has read it. (The whole weight in one panel goes out
// to memory and comes back: for the fused q/k/v projection in fp32, 113 MB
// written and read again, which made a 64-token prefill with int8 weights
// take 1.6x bf16's time.)
constexpr int64_t kPanelBytesPerThread = int64_t{1} << 20;
// Rows per dequantization job within a tile.
constexpr int64_t kPanelJobRows = 16;

int64_t RoundUp(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

}  // namespace

void Linear::Forward(MutBuf y, ConstBuf x, int64_t m) const {
  Check(x.dtype == dtype_,
        std::string("Linear: input dtype ") + DTypeName(x.dtype) + " does not match weight dtype " + DTypeName(dtype_));
  Check(y.dtype == DType::kF32 || y.dtype == dtype_, "Linear: output dtype must be F32 or the weight dtype");
  Check(m >= 0, "Linear: negative row count");
  if (m == 0) return;
  // The bf16 pipeline's route for m rows (kda/kernels/gemm_route.h); fp32 is fp32 FMA.
  const GemmRoute route = PipelineGemmPlan(dtype_).ForRows(m);
  if (route == GemmRoute::kAmx && dtype_ == DType::kBF16 && in_ % internal::kTileGemmDepth == 0 &&
      internal::TileGemmRuns()) {
    // kda's own tile GEMM: the weights read in place (Q8 dequantized a job's rows at a time).
    internal::TileGemmArgs a;
    a.m = m;
    a.n = out_;
    a.k = in_;
    a.ldy = out_;
    internal::SetGemmOutput(a, y.data, y.dtype == DType::kBF16);
    const bool q8 = format_ == WeightFormat::kInt8;
    internal::TileGemm(a, static_cast<const BF16*>(x.data), q8 ? nullptr : impl_->w_bf16.data(),
                       q8 ? &impl_->q8 : nullptr);
    return;
  }
  if (route != GemmRoute::kAmx && m <= internal::kGemvMaxRows &&
      (format_ == WeightFormat::kInt8 || in_ % internal::kGemvBlock == 0)) {
    ForwardSmall(y, x, m, route == GemmRoute::kBf16Dot);
    return;
  }
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dt ct = route == GemmRoute::kF32Fma ? dt::f32 : dt::bf16;

  // Inputs in the compute type (bf16 widened to fp32 on the fp32 FMA route).
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
  const dt dst_type = native_bf16_out ? dt::bf16 : dt::f32;
  const size_t dst_size = native_bf16_out ? sizeof(BF16) : sizeof(float);
  const dnnl::memory::desc src_md({m, in_}, ct, tag::ab);
  dnnl::memory src(src_md, CpuEngine(), const_cast<void*>(src_ptr));  // NOLINT: oneDNN takes void*
  dnnl::stream stream(CpuEngine());

  // Output columns [n0, n0 + cols) = x . W[n0 : n0 + cols]^T, the weight rows
  // at w ([cols, in] row-major, viewed as [in, cols] with strides {1, in}).
  // A tile of columns is computed into a dense [m, cols] block and copied to
  // its columns of y: given y's row stride instead, oneDNN 2.6 leaves its
  // brgemm for a jit GEMM that ran fp32 tiles at 0.35-0.45x the speed (Zen 4,
  // 2 threads; 0.1x at m = 64 and 256 columns).
  ScratchBlock tile_out;
  const auto multiply = [&](int64_t n0, int64_t cols, void* w) {
    const dnnl::memory::desc w_md({in_, cols}, ct, dnnl::memory::dims{1, in_});
    const dnnl::memory::desc dst_md({m, cols}, dst_type, dnnl::memory::format_tag::ab);
    dnnl::matmul prim;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      const Impl::PrimitiveKey key{m, cols, route, native_bf16_out};
      auto it = impl_->primitives.find(key);
      if (it == impl_->primitives.end()) {
        // A serving loop sees many row counts: keep the cache bounded.
        if (impl_->primitives.size() >= kMaxCachedPrimitives) impl_->primitives.clear();
        const dnnl::matmul::desc desc(src_md, w_md, dst_md);
        const dnnl::matmul::primitive_desc pd(desc, CpuEngine());
        it = impl_->primitives.emplace(key, dnnl::matmul(pd)).first;
      }
      prim = it->second;
    }
    dnnl::memory weights(w_md, CpuEngine(), w);
    const bool whole = cols == out_;
    if (!whole && tile_out.data() == nullptr) tile_out = ScratchBlock(static_cast<size_t>(m * cols) * dst_size);
    dnnl::memory dst(dst_md, CpuEngine(), whole ? dst_ptr : tile_out.data());
    prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    stream.wait();
    if (!whole) {
      const size_t row = static_cast<size_t>(cols) * dst_size;
      ParallelFor(m, [&](int64_t i) {
        std::memcpy(static_cast<char*>(dst_ptr) + static_cast<size_t>(i * out_ + n0) * dst_size,
                    static_cast<const char*>(tile_out.data()) + static_cast<size_t>(i) * row, row);
      });
    }
  };

  if (format_ == WeightFormat::kDense && (dtype_ == DType::kF32 || ct == dt::bf16)) {
    multiply(0, out_, ct == dt::bf16 ? static_cast<void*>(impl_->w_bf16.data()) : impl_->w_f32.data());
  } else {
    // Q8 weights, and bf16 weights on the fp32 FMA route: each tile of
    // output rows dequantized (widened) into the panel in the compute type
    // (the bf16 pipeline's Q8 weights rounded to bf16, as a dense bf16
    // Linear holds them), then the same GEMM as dense weights on it.
    const internal::KernelTable& kernels = internal::ActiveKernels();
    const int64_t k = in_;
    const int64_t w_size = ct == dt::bf16 ? int64_t{sizeof(BF16)} : int64_t{sizeof(float)};
    // A tile of at least m rows: the GEMM reads the m input rows again for
    // each tile, which then adds no more traffic than the weight itself.
    const int64_t cache_rows = kPanelBytesPerThread * NumThreads() / (k * w_size);
    const int64_t tile = std::min(out_, RoundUp(std::max(cache_rows, m), kPanelJobRows));
    ScratchBlock panel(static_cast<size_t>(tile * k * w_size));
    const bool round_bf16 = dtype_ == DType::kBF16;
    for (int64_t n0 = 0; n0 < out_; n0 += tile) {
      const int64_t cols = std::min(tile, out_ - n0);
      ParallelFor((cols + kPanelJobRows - 1) / kPanelJobRows, [&](int64_t job) {
        const int64_t r0 = job * kPanelJobRows;
        const int64_t r1 = std::min(cols, r0 + kPanelJobRows);
        if (format_ == WeightFormat::kDense) {
          kernels.to_f32(static_cast<float*>(panel.data()), impl_->w_bf16.data() + n0 * k, r0 * k, r1 * k);
          return;
        }
        const int8_t* q = impl_->q8.q.data() + n0 * k;
        const uint16_t* scales = impl_->q8.scales.data() + n0 * (k / kQ8Block);
        if (ct == dt::bf16) {
          kernels.q8_dequant_bf16(static_cast<BF16*>(panel.data()), q, scales, k, r0, r1);
        } else {
          kernels.q8_dequant_f32(static_cast<float*>(panel.data()), q, scales, k, r0, r1, round_bf16);
        }
      });
      multiply(n0, cols, panel.data());
    }
  }

  if (y.dtype == DType::kBF16 && !native_bf16_out) {
    ConvertToBF16(static_cast<BF16*>(y.data), acc.data(), m * out_);
  }
}

}  // namespace kda
