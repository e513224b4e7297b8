// Fuzzes `kda run`'s input validation (ReadRunInput): hidden_states, cu_seqlens and the initial states, their
// dtypes, shapes, cu_seqlens values and non-finite values, for a layer shape taken from the input.
//
// Input: a mode byte, then either (odd mode) a safetensors file framed as in safetensors_fuzzer.cc, or (even
// mode) a description from which the input file is built with WriteSafetensors: each tensor present or not,
// its dtype, shape (mostly the expected one, sometimes perturbed) and values (cu_seqlens mostly valid, with up
// to 65,536 sequences; floats mostly finite, with a NaN or infinity planted at a chosen element).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "kda/base/error.h"
#include "kda/io/safetensors.h"
#include "kda/layers/delta_rule_geometry.h"
#include "tools/run_input.h"

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 18;  // per tensor, to keep a run fast

// Where the structured mode writes its file; removed at exit.
const kda::fuzz::TempDir& WorkDir() {
  static const kda::fuzz::TempDir dir;
  return dir;
}

// One tensor of the file being built; `bytes` holds its data.
struct Built {
  std::string name;
  kda::DType dtype = kda::DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// `want` unless the input asks for a change: a dimension altered, dropped or added.
std::vector<int64_t> PickShape(FuzzedDataProvider& p, std::vector<int64_t> want) {
  switch (p.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      if (!want.empty()) want[p.ConsumeIntegralInRange<size_t>(0, want.size() - 1)] = p.ConsumeIntegralInRange(0, 9);
      break;
    case 1:
      if (!want.empty()) want.pop_back();
      break;
    case 2:
      want.push_back(p.ConsumeIntegralInRange(0, 3));
      break;
    default:
      break;
  }
  return want;
}

kda::DType PickDType(FuzzedDataProvider& p, kda::DType want) {
  static constexpr kda::DType kAll[] = {kda::DType::kF32, kda::DType::kBF16, kda::DType::kI32, kda::DType::kI64};
  return p.ConsumeIntegralInRange<int>(0, 5) < 4 ? want : p.PickValueInArray(kAll);
}

void StoreValue(Built* t, int64_t i, double v) {
  uint8_t* at = t->bytes.data() + static_cast<size_t>(i) * kda::DTypeSize(t->dtype);
  switch (t->dtype) {
    case kda::DType::kF32: {
      const auto f = static_cast<float>(v);
      std::memcpy(at, &f, 4);
      break;
    }
    case kda::DType::kBF16: {
      const kda::BF16 b = kda::ToBF16(static_cast<float>(v));
      std::memcpy(at, &b.bits, 2);
      break;
    }
    case kda::DType::kI32: {
      if (!std::isfinite(v)) v = 0;  // a NaN planted in an integer tensor
      const auto n = static_cast<int32_t>(std::clamp<double>(v, -2147483648.0, 2147483647.0));
      std::memcpy(at, &n, 4);
      break;
    }
    case kda::DType::kI64: {
      if (!std::isfinite(v)) v = 0;
      const auto n = static_cast<int64_t>(std::clamp<double>(v, -9.2e18, 9.2e18));
      std::memcpy(at, &n, 8);
      break;
    }
    case kda::DType::kU8:
    case kda::DType::kI8:
    case kda::DType::kF16:
      break;  // never picked (kAll)
  }
}

// Fills a float tensor with finite values, maybe planting one NaN or infinity.
void FillFloats(FuzzedDataProvider& p, Built* t) {
  const int64_t n = Product(t->shape);
  for (int64_t i = 0; i < n; ++i) StoreValue(t, i, static_cast<double>(i % 17) * 0.25 - 2.0);
  if (n > 0 && p.ConsumeBool()) {
    static constexpr double kBad[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity(), 1e39 /* +inf as float */};
    StoreValue(t, p.ConsumeIntegralInRange<int64_t>(0, n - 1), p.PickValueInArray(kBad));
  }
}

// cu_seqlens for T tokens: N + 1 entries from 0 to T, then maybe one entry changed.
void FillCuSeqlens(FuzzedDataProvider& p, Built* t, int64_t T) {
  const int64_t n = Product(t->shape);
  int64_t value = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i == n - 1) {
      value = T;
    } else if (i > 0) {
      value = std::min<int64_t>(T, value + p.ConsumeIntegralInRange<int64_t>(0, 3));
    }
    StoreValue(t, i, static_cast<double>(value));
  }
  if (n > 0 && p.ConsumeIntegralInRange<int>(0, 3) == 0) {
    StoreValue(t, p.ConsumeIntegralInRange<int64_t>(0, n - 1), static_cast<double>(p.ConsumeIntegral<int32_t>()));
  }
}

// Writes the input file of the structured mode (a tensor that would exceed kMaxElements is left out).
void BuildFile(FuzzedDataProvider& p, const kda::DeltaRuleGeometry& shape, const std::string& path) {
  const int64_t T = p.ConsumeIntegralInRange<int64_t>(0, 40);
  const int64_t N = p.ConsumeBool() ? p.ConsumeIntegralInRange<int64_t>(1, 6)
                                    : p.ConsumeIntegralInRange<int64_t>(1, 65536);  // many short sequences
  std::vector<Built> tensors;
  auto add = [&](const std::string& name, kda::DType want_dtype, const std::vector<int64_t>& want_shape,
                 bool usually_present) -> Built* {
    if (p.ConsumeIntegralInRange<int>(0, 7) >= (usually_present ? 7 : 4)) return nullptr;
    Built t;
    t.name = name;
    t.dtype = PickDType(p, want_dtype);
    t.shape = PickShape(p, want_shape);
    const int64_t n = Product(t.shape);
    if (n > kMaxElements) return nullptr;
    t.bytes.assign(static_cast<size_t>(n) * kda::DTypeSize(t.dtype), 0);
    tensors.push_back(std::move(t));
    return &tensors.back();
  };
  tensors.reserve(4);
  if (Built* x = add("hidden_states", kda::DType::kF32, {T, shape.hidden}, true)) FillFloats(p, x);
  if (Built* cu = add("cu_seqlens", kda::DType::kI64, {N + 1}, true)) FillCuSeqlens(p, cu, T);
  if (Built* r = add("initial_recurrent_state", kda::DType::kF32, {N, shape.HV, shape.K, shape.V}, false)) {
    FillFloats(p, r);
  }
  if (Built* c = add("initial_conv_state", kda::DType::kBF16, {N, shape.W - 1, shape.conv_channels()}, false)) {
    FillFloats(p, c);
  }
  std::vector<kda::TensorToWrite> to_write;
  for (const Built& t : tensors) to_write.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  kda::WriteSafetensors(path, to_write);
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return kda::fuzz::MutateWithMacros(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  // A KDA layer (H = HV heads of K = V dims) or a Gated DeltaNet one (HV = r H value heads, K != V).
  const int heads = 1 + data[2] % 3;
  const int head_dim = 1 + data[3] % 4;
  const int64_t hidden = 1 + data[1] % 8;
  const int conv = 1 + data[0] / 2 % 4;
  const kda::DeltaRuleGeometry shape = (data[2] & 8) != 0
                                           ? kda::DeltaRuleGeometry::Gdn(hidden, heads, heads * (1 + data[3] / 4 % 3),
                                                                         head_dim, 1 + data[3] / 16 % 4, conv, 1e-6)
                                           : kda::DeltaRuleGeometry::Kda(hidden, heads, head_dim, conv, 1e-5);
  const std::string path = (WorkDir().path() / "input.safetensors").string();
  try {
    if ((data[0] & 1) != 0) {
      const std::string body = kda::fuzz::Expand(data + 4, size - 4);
      const size_t nul = body.find('\0');
      const kda::fuzz::MemFile mem(nul == std::string::npos
                                       ? kda::fuzz::FrameSafetensors(body, "")
                                       : kda::fuzz::FrameSafetensors(body.substr(0, nul), body.substr(nul + 1)));
      kda::cli::ReadRunInput(kda::SafetensorsFile::Open(mem.path()), shape);
      return 0;
    }
    FuzzedDataProvider p(data + 4, size - 4);
    BuildFile(p, shape, path);
    const kda::cli::RunInput in = kda::cli::ReadRunInput(kda::SafetensorsFile::Open(path), shape);
    // What is accepted is what `kda run` relies on.
    if (in.N < 1 || in.cu.size() != static_cast<size_t>(in.N + 1) || in.cu.front() != 0 || in.cu.back() != in.T) {
      std::abort();
    }
    if (!std::is_sorted(in.cu.begin(), in.cu.end())) std::abort();
    if (in.x.size() != static_cast<size_t>(in.T * shape.hidden)) std::abort();
    const int64_t rec_size = shape.state_spec().recurrent_size();  // one sequence's [HV, K, V]
    const int64_t conv_size = shape.state_spec().conv_size();      // [W-1, C]
    if (!in.rec.empty() && in.rec.size() != static_cast<size_t>(in.N * rec_size)) std::abort();
    if (!in.conv.empty() && in.conv.size() != static_cast<size_t>(in.N * conv_size)) std::abort();
    for (const std::vector<float>* v : {&in.x, &in.rec, &in.conv}) {
      if (!std::all_of(v->begin(), v->end(), [](float f) { return std::isfinite(f); })) std::abort();
    }
  } catch (const kda::Error&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
