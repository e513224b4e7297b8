// Fuzzes the boundary where untrusted shapes, strides and indices enter: the
// kernel call descriptions of kda/kernels/kda_args.h. Each input builds a
// random ChunkKdaCall or RecurrentKdaCall whose every tensor is allocated to
// exactly the extent its view claims (so that one element past it is an
// AddressSanitizer report), mostly near a valid call and now and then with a
// view absent, of the wrong rank, shape or dtype, strided, or null, and with
// random index values, over fla's options (grouped value heads, any head dims,
// float16, several tokens per sequence, slots per token and accepted counts,
// V-first states) and both gate widths (KDA's per key dimension, Gated
// DeltaNet's per value head, through either entry). Token views are often token-strided as a fused
// projection's slices (accepted for q, k, v; now and then with a token stride
// short of the row or a batch stride out of step). The call is shape-checked
// (data null), then bound and run on the reference kernels or the optimized
// ones (in an instruction set the CPU has, chosen by the input): a
// kda::Error, or a call that stays in bounds.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/error.h"
#include "kda/kernels/chunk_kda_reference.h"
#include "kda/kernels/fused_recurrent_kda_reference.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/kda_optimized.h"
#include "kda/kernels/kernel_isa.h"

namespace {

using kda::DType;

// The input as a stream of choices (zeros once it runs out).
class Choices {
 public:
  Choices(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  int Below(int n) { return Byte() % n; }
  bool OneIn(int n) { return Below(n) == 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Buffers of exactly the requested size, freed with the case.
class Arena {
 public:
  uint8_t* Alloc(size_t bytes) {
    buffers_.push_back(std::make_unique<uint8_t[]>(bytes));
    return buffers_.back().get();
  }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
};

// What a tensor holds when its values matter.
enum class Fill : uint8_t { kFloat, kCuSeqlens, kIndices, kFlags };

struct Sizes {
  int64_t B, T, N, H, HV, K, V, S;
  int64_t C;  // slots per sequence of 2-D ssm_state_indices
};

class CaseBuilder {
 public:
  CaseBuilder(Choices& c, Arena& arena, const Sizes& s) : c_(c), arena_(arena), s_(s) {}

  // A view of the intended shape and dtype, or (one time in ~6) one thing wrong with it. A token view
  // ([B, T, heads, dim]: q, k, v, g, beta per value, o) is token-strided one time in 3.
  template <class View>
  View Make(std::initializer_list<int64_t> shape, DType dtype, Fill fill, bool optional_absent = false,
            bool token_view = false) {
    View v;
    if (optional_absent && !c_.OneIn(8)) return v;
    v.dtype = dtype;
    v.ndim = static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) v.shape[i++] = d;
    const bool token_strided = token_view && c_.OneIn(3);
    v.strided = token_strided;
    switch (c_.Below(24)) {
      case 0:
        return View{};  // absent
      case 1:
        v.ndim = v.ndim > 0 && c_.OneIn(2) ? v.ndim - 1 : v.ndim + 1;
        if (v.ndim > 0) v.shape[v.ndim - 1] = 1 + c_.Below(3);
        break;
      case 2:
        if (v.ndim > 0) v.shape[c_.Below(v.ndim)] += c_.OneIn(2) ? 1 : -1;
        break;
      case 3:
        v.dtype = static_cast<DType>(c_.Below(7));
        break;
      case 4:
        v.foreign_dtype = "float64";
        break;
      case 5:
        v.strided = true;
        break;
      default:
        break;
    }
    for (int d = 0; d < v.ndim; ++d) {
      if (v.shape[d] < 0) v.shape[d] = 0;
    }
    int64_t extent = 1;
    if (token_strided && v.ndim == 4) {
      // A fused projection's columns: strides [T * s, s, dim, 1], s mostly past the row (now and then short of
      // it), the batch stride now and then out of step.
      const int64_t s = v.shape[2] * v.shape[3] + c_.Below(6) - 1;
      v.strides[0] = v.shape[1] * s + (c_.OneIn(8) ? 1 : 0);
      v.strides[1] = s;
      v.strides[2] = v.shape[3];
      v.strides[3] = 1;
    } else if (v.strided) {
      // Row-major strides with one of them stretched (a gap) or shrunk.
      int64_t stride = 1;
      for (int d = v.ndim; d-- > 0;) {
        v.strides[d] = stride;
        stride *= v.shape[d];
      }
      if (v.ndim > 0) v.strides[c_.Below(v.ndim)] += c_.OneIn(2) ? 1 : -1;
    }
    if (v.strided) {
      for (int d = 0; d < v.ndim; ++d) {
        if (v.strides[d] < 0) v.strides[d] = 0;
        if (v.shape[d] == 0) extent = 0;
        if (extent > 0) extent += (v.shape[d] - 1) * v.strides[d];
      }
    } else {
      extent = v.numel();
    }
    if (c_.OneIn(24)) return v;  // null data
    const size_t esize = v.foreign_dtype != nullptr ? 8 : kda::DTypeSize(v.dtype);
    uint8_t* p = arena_.Alloc(static_cast<size_t>(extent) * esize);
    FillValues(p, v.foreign_dtype != nullptr ? DType::kI64 : v.dtype, extent, fill);
    v.data = p;
    return v;
  }

 private:
  void FillValues(uint8_t* p, DType dtype, int64_t n, Fill fill) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t value = 0;
      switch (fill) {
        case Fill::kFloat:
          value = c_.Below(9) - 6;  // small values, mostly negative: a log decay
          break;
        case Fill::kCuSeqlens:  // near [0, T/N, ...], T
          value = i == n - 1 ? s_.T : (i * s_.T) / std::max<int64_t>(n - 1, 1);
          if (c_.OneIn(16)) value += c_.Below(5) - 2;
          break;
        case Fill::kIndices:  // distinct mostly, now and then out of range or padding
          value = c_.OneIn(8) ? c_.Below(static_cast<int>(s_.S) + 3) - 2 : i;
          break;
        case Fill::kFlags:
          value = c_.Below(2);
          break;
      }
      Store(p, dtype, i, value);
    }
  }

  static void Store(uint8_t* p, DType dtype, int64_t i, int64_t value) {
    switch (dtype) {
      case DType::kF32: {
        const auto f = static_cast<float>(value) * 0.25F;
        std::memcpy(p + i * 4, &f, 4);
        break;
      }
      case DType::kBF16: {
        const kda::BF16 b = kda::ToBF16(static_cast<float>(value) * 0.25F);
        std::memcpy(p + i * 2, &b, 2);
        break;
      }
      case DType::kF16: {
        const kda::F16 h = kda::ToF16(static_cast<float>(value) * 0.25F);
        std::memcpy(p + i * 2, &h, 2);
        break;
      }
      case DType::kI32: {
        const auto x = static_cast<int32_t>(value);
        std::memcpy(p + i * 4, &x, 4);
        break;
      }
      case DType::kI64:
        std::memcpy(p + i * 8, &value, 8);
        break;
      case DType::kU8:
      case DType::kI8:
        p[i] = static_cast<uint8_t>(value);
        break;
    }
  }

  Choices& c_;
  Arena& arena_;
  const Sizes& s_;
};

using kda::MutTensorView;
using kda::TensorView;

template <class Call>
void SetTokens(Call& call, Choices& c, CaseBuilder& b, const Sizes& s, DType act, DType gb) {
  // k and v now and then in another float dtype than q (fla's mixed dtypes: run on fp32 copies), o then
  // in q's or v's.
  static constexpr DType kFloats[] = {DType::kF32, DType::kBF16, DType::kF16};
  const DType kt = c.OneIn(6) ? kFloats[c.Below(3)] : act;
  const DType vt = c.OneIn(6) ? kFloats[c.Below(3)] : act;
  call.o = b.Make<MutTensorView>({s.B, s.T, s.HV, s.V}, c.OneIn(2) ? act : vt, Fill::kFloat, false, c.OneIn(8));
  call.q = b.Make<TensorView>({s.B, s.T, s.H, s.K}, act, Fill::kFloat, false, true);
  call.k = b.Make<TensorView>({s.B, s.T, s.H, s.K}, kt, Fill::kFloat, false, true);
  call.v = b.Make<TensorView>({s.B, s.T, s.HV, s.V}, vt, Fill::kFloat, false, true);
  // A gate per key dimension (KDA), or one per value head (Gated DeltaNet) one time in 3.
  call.g = c.OneIn(3) ? b.Make<TensorView>({s.B, s.T, s.HV}, gb, Fill::kFloat)
                      : b.Make<TensorView>({s.B, s.T, s.HV, s.K}, gb, Fill::kFloat, false, c.OneIn(8));
  if (c.OneIn(4)) call.entry = kda::DeltaRuleEntry::kGatedDeltaRule;
  // A beta per value: fused_recurrent_kda's option (chunk_kda refuses it).
  call.beta = c.OneIn(6) ? b.Make<TensorView>({s.B, s.T, s.HV, s.V}, gb, Fill::kFloat, false, c.OneIn(8))
                         : b.Make<TensorView>({s.B, s.T, s.HV}, gb, Fill::kFloat);
}

template <class Call>
void SetOptions(Call& call, Choices& c, CaseBuilder& b, const Sizes& s) {
  if (c.OneIn(3)) call.scale = c.OneIn(8) ? -1.0F : 0.125F * static_cast<float>(1 + c.Below(8));
  call.use_qk_l2norm_in_kernel = c.OneIn(2);
  call.use_gate_in_kernel = c.OneIn(3);
  call.use_beta_sigmoid_in_kernel = c.OneIn(4);
  call.allow_neg_eigval = c.OneIn(6);
  call.state_v_first = c.OneIn(6);
  if (c.OneIn(4)) call.lower_bound = c.OneIn(8) ? 0.5F : -0.5F * static_cast<float>(1 + c.Below(10));
  if (call.use_gate_in_kernel) {
    call.A_log = b.Make<TensorView>({s.HV}, DType::kF32, Fill::kFloat, call.lower_bound.has_value());
    const bool scalar_gate = call.g.ndim == 3;  // one bias per value head (one time in 8 the other width)
    call.dt_bias = b.Make<TensorView>({scalar_gate != c.OneIn(8) ? s.HV : s.HV * s.K}, DType::kF32, Fill::kFloat, true);
  }
}

// [rows, HV, K, V] states, [rows, HV, V, K] with state_v_first: f32, or `dt` (an initial state fla also takes
// in bf16 or f16).
template <class View, class Call>
View States(CaseBuilder& b, const Call& call, const Sizes& s, int64_t rows, bool optional_absent = false,
            DType dt = DType::kF32) {
  return call.state_v_first ? b.Make<View>({rows, s.HV, s.V, s.K}, dt, Fill::kFloat, optional_absent)
                            : b.Make<View>({rows, s.HV, s.K, s.V}, dt, Fill::kFloat, optional_absent);
}

// An initial state's dtype: now and then bf16 or f16.
DType InitialStateDType(Choices& c) {
  if (!c.OneIn(6)) return DType::kF32;
  return c.OneIn(2) ? DType::kBF16 : DType::kF16;
}

// A call's token tensors, options and sequences: packed ones (B = 1, cu_seqlens
// int64 or int32) or the B rows.
template <class Call>
Call TokensAndOptions(Choices& c, CaseBuilder& b, const Sizes& s, DType act, DType gb, bool& packed) {
  Call call;
  SetTokens(call, c, b, s, act, gb);
  SetOptions(call, c, b, s);
  packed = s.B == 1 && c.OneIn(2);
  if (packed) {
    call.cu_seqlens = b.Make<TensorView>({s.N + 1}, c.OneIn(2) ? DType::kI64 : DType::kI32, Fill::kCuSeqlens);
  }
  return call;
}

// Which kernels run a bound call: the reference, or the optimized ones in an
// instruction set the CPU has.
bool ChooseOptimized(Choices& c) {
  static constexpr kda::KernelIsa kIsas[] = {kda::KernelIsa::kGeneric, kda::KernelIsa::kAvx2, kda::KernelIsa::kAvx512,
                                             kda::KernelIsa::kAvx512Shape};
  if (c.OneIn(2)) return false;
  const kda::KernelIsa isa = kIsas[c.Below(4)];
  kda::SetKernelIsa(kda::CpuSupportsKernelIsa(isa) ? isa : kda::KernelIsa::kGeneric);
  return true;
}

// The call with its data null (tokens, output, states), for the shape check (which must not read them).
template <class Call>
Call WithoutData(Call call) {
  for (TensorView* v : {&call.q, &call.k, &call.v, &call.g, &call.beta}) v->data = nullptr;
  call.o.data = nullptr;
  call.initial_state.data = nullptr;
  call.final_state.data = nullptr;
  if constexpr (std::is_same_v<Call, kda::ChunkKdaCall>) {
    call.state.data = nullptr;
    call.intermediate_states.data = nullptr;
  }
  return call;
}

// Picks the kernels (ChooseOptimized), shape-checks the call without its data,
// then binds it and runs it: each a kda::Error or a call in bounds.
template <class Call, class Args>
void Exercise(Choices& c, const Call& call, kda::KdaCallShapes (*check)(const Call&), Args (*bind)(const Call&),
              void (*optimized)(const Args&), void (*reference)(const Args&),
              void (*dispatch)(const Call&, kda::KernelImpl)) {
  const Call shapes = WithoutData(call);
  const bool use_optimized = ChooseOptimized(c);
  try {
    check(shapes);
  } catch (const kda::Error&) {
  }
  try {
    if (kda::NeedsFloat32Copies(call)) {  // a bind refuses it: the entry runs it on fp32 copies
      dispatch(call, use_optimized ? kda::KernelImpl::kOptimized : kda::KernelImpl::kReference);
    } else {
      (use_optimized ? optimized : reference)(bind(call));
    }
  } catch (const kda::Error&) {
  }
}

void RunChunk(Choices& c, CaseBuilder& b, const Sizes& s, DType act, DType gb) {
  bool packed = false;
  auto call = TokensAndOptions<kda::ChunkKdaCall>(c, b, s, act, gb, packed);
  const int64_t n = packed ? s.N : s.B;
  call.safe_gate = c.OneIn(8);
  if (c.OneIn(8)) call.chunk_size = 16 * (1 + c.Below(3));  // 16 (GDN's only), 32, 48 (refused)
  if (c.OneIn(2)) {                                         // pool form
    call.state = States<MutTensorView>(b, call, s, s.S);
    call.state_indices = b.Make<TensorView>({n}, DType::kI32, Fill::kIndices);
    call.has_initial_state = b.Make<TensorView>({n}, DType::kU8, Fill::kFlags, true);
    if (c.OneIn(16)) call.initial_state = States<TensorView>(b, call, s, n);
  } else {
    call.initial_state = States<TensorView>(b, call, s, n, true, InitialStateDType(c));
    call.output_final_state = !c.OneIn(4);
    if (call.output_final_state || c.OneIn(8)) call.final_state = States<MutTensorView>(b, call, s, n);
  }
  call.return_intermediate_states = c.OneIn(4);
  if (call.return_intermediate_states || c.OneIn(16)) {
    // fla's h [B, NT, HV, K, V]: with cu_seqlens the right NT depends on their values, hit only at times.
    const int64_t cs = call.chunk_size;
    const int64_t nt = (s.T + cs - 1) / cs + (packed ? c.Below(static_cast<int>(s.N) + 1) : 0);
    const DType dt = c.OneIn(8) ? DType::kF32 : act;
    call.intermediate_states = call.state_v_first ? b.Make<MutTensorView>({s.B, nt, s.HV, s.V, s.K}, dt, Fill::kFloat)
                                                  : b.Make<MutTensorView>({s.B, nt, s.HV, s.K, s.V}, dt, Fill::kFloat);
  }
  Exercise(c, call, kda::CheckChunkKdaShapes, kda::BindChunkKda, kda::chunk_kda_optimized, kda::chunk_kda_reference,
           kda::chunk_kda);
}

void RunRecurrent(Choices& c, CaseBuilder& b, const Sizes& s, DType act, DType gb) {
  bool packed = false;
  auto call = TokensAndOptions<kda::RecurrentKdaCall>(c, b, s, act, gb, packed);
  const int64_t n = packed ? s.N : s.B;
  call.inplace_final_state = !c.OneIn(3);
  call.output_final_state = c.OneIn(2);
  switch (c.Below(3)) {
    case 0:  // contiguous states
      call.initial_state = States<MutTensorView>(b, call, s, n, !call.inplace_final_state, InitialStateDType(c));
      if (!call.inplace_final_state && (call.output_final_state || c.OneIn(8))) {
        call.final_state = States<MutTensorView>(b, call, s, n);
      }
      break;
    case 1:  // the pool, a slot per sequence
      call.initial_state = States<MutTensorView>(b, call, s, s.S, false, InitialStateDType(c));
      call.ssm_state_indices = b.Make<TensorView>({n}, DType::kI32, Fill::kIndices);
      break;
    default:  // the pool, a slot per token, accepted counts
      call.initial_state = States<MutTensorView>(b, call, s, s.S);
      call.ssm_state_indices = b.Make<TensorView>({n, s.C}, DType::kI32, Fill::kIndices);
      if (c.OneIn(2)) call.num_accepted_tokens = b.Make<TensorView>({n}, DType::kI32, Fill::kFlags);
      break;
  }
  if (call.ssm_state_indices.present() && !call.inplace_final_state && (call.output_final_state || c.OneIn(8))) {
    call.final_state = States<MutTensorView>(b, call, s, s.B * s.T);  // a state per token
  }
  if (c.OneIn(16) && !call.num_accepted_tokens.present()) {
    call.num_accepted_tokens = b.Make<TensorView>({n}, DType::kI32, Fill::kFlags);
  }
  Exercise(c, call, kda::CheckRecurrentKdaShapes, kda::BindRecurrentKda, kda::fused_recurrent_kda_optimized,
           kda::fused_recurrent_kda_reference, kda::fused_recurrent_kda);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Choices c(data, size);
  const bool chunk = c.OneIn(2);
  Sizes s{};
  s.H = 1 + c.Below(2);
  s.HV = s.H * (c.OneIn(3) ? 1 + c.Below(3) : 1) + (c.OneIn(16) ? 1 : 0);
  static constexpr int64_t kHeadDims[] = {16, 32, 5, 8, 24, 0, 100, 260};
  s.K = kHeadDims[c.Below(c.OneIn(8) ? 8 : 5)];
  s.V = c.OneIn(4) ? kHeadDims[c.Below(c.OneIn(8) ? 8 : 5)] : s.K;
  s.B = c.Below(3) + (c.OneIn(8) ? 0 : 1);
  s.T = c.Below(chunk ? 80 : 6);
  s.N = 1 + c.Below(4);
  s.S = c.Below(8);
  s.C = 1 + c.Below(4);
  static constexpr DType kActs[] = {DType::kF32, DType::kBF16, DType::kF16};
  const DType act = kActs[c.Below(3)];
  const DType gb = kActs[c.Below(3)];
  Arena arena;
  CaseBuilder b(c, arena, s);
  if (chunk) {
    RunChunk(c, b, s, act, gb);
  } else {
    RunRecurrent(c, b, s, act, gb);
  }
  return 0;
}
