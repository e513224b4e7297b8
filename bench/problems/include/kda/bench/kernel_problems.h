// Random KDA kernel problems for the benchmarks (bench/kernels_bench.cc and
// `kda bench-kernels`): inputs shaped like the layer's (q, k raw with the
// in-kernel L2 norm, trained-like gates, beta in (0, 1)), owned buffers, and
// the kernel calls over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "base/scratch.h"
#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/kernels/kda_args.h"

namespace kda::bench {

// A float buffer stored as F32, BF16 or F16.
// Stored in scratch blocks, as the layer's activations are (large ones on
// huge pages).
class TypedBuffer {
 public:
  TypedBuffer(const std::vector<float>& x, DType dtype);
  ConstBuf Const() const {
    return {dtype_ == DType::kF32 ? static_cast<const void*>(f32_.data()) : half_.data(), dtype_};
  }
  MutBuf Mut() { return {dtype_ == DType::kF32 ? static_cast<void*>(f32_.data()) : half_.data(), dtype_}; }
  // A C-contiguous view of the buffer as `shape`.
  TensorView View(std::initializer_list<int64_t> shape) const { return ContiguousView(Const().data, dtype_, shape); }
  MutTensorView MutView(std::initializer_list<int64_t> shape) { return ContiguousView(Mut().data, dtype_, shape); }

 private:
  DType dtype_;
  ScratchArray<float> f32_;
  ScratchArray<uint16_t> half_;  // BF16 or F16 bits
};

// Token inputs of `rows` (token, head) rows: q, k, v, g [rows, K], beta [rows].
struct TokenInputs {
  TokenInputs(int64_t rows, int k_dim, DType dtype, uint32_t seed);

  // Roughly N(0, scale^2) (a sum of four uniforms from a xorshift generator:
  // benchmarks need plausible values quickly, not a precise distribution).
  static std::vector<float> Random(int64_t n, uint32_t seed, float scale);
  // Log decays like a trained gate: mostly slow (-exp(-3.5 + N(0, 1))).
  static std::vector<float> Gates(int64_t n, uint32_t seed);
  static std::vector<float> Betas(int64_t n, uint32_t seed);

  TypedBuffer q, k, v, g, beta, o;  // g and beta fp32 (as the layer passes them)
};

// A packed prefill batch of sequences of the given lengths, H heads of K = V.
struct ChunkProblem {
  ChunkProblem(const std::vector<int64_t>& lengths, int heads, int k_dim, DType dtype, uint32_t seed = 1);
  ChunkProblem(const ChunkProblem&) = delete;
  ChunkProblem& operator=(const ChunkProblem&) = delete;

  // The q, k, v, g buffers, for HugePageFraction (the rows the kernel walks a page apart).
  std::vector<std::pair<const void*, size_t>> InputBuffers() const {
    std::vector<std::pair<const void*, size_t>> out;
    for (const TensorView* v : {&call.q, &call.k, &call.v, &call.g}) {
      out.emplace_back(v->data, static_cast<size_t>(v->numel()) * DTypeSize(v->dtype));
    }
    return out;
  }
  int64_t T() const { return call.q.shape[1]; }  // tokens (packed: [1, T, H, K])
  int64_t N() const { return call.cu_seqlens.shape[0] - 1; }

  static std::vector<int64_t> CuSeqlens(const std::vector<int64_t>& lengths);

  std::vector<int64_t> cu;
  TokenInputs in;
  std::vector<float> initial, final_state;
  ChunkKdaCall call;  // [1, T, H, K] tokens, int64 cu_seqlens, contiguous initial and final states
};

// Decode steps of N sequences (one token each) over a state buffer of
// `layers` slots of N states each ([layers * N, H, K, V]); step i uses the
// states of layer i % layers, so that with enough layers (as a model has)
// every step reads its states from memory, not from the cache.
struct DecodeProblem {
  // `tokens` per sequence ([N, tokens, H, K] rows; the final state back into the slot).
  DecodeProblem(int64_t n, int heads, int k_dim, int layers, DType dtype, uint32_t seed = 1, int64_t tokens = 1);
  DecodeProblem(const DecodeProblem&) = delete;
  DecodeProblem& operator=(const DecodeProblem&) = delete;

  // The call of step i.
  const RecurrentKdaCall& Step(int64_t i) {
    const auto per_layer = static_cast<size_t>(call.initial_state.numel());
    call.initial_state.data = states.data() + static_cast<size_t>(i % num_layers) * per_layer;
    return call;
  }
  // Layers needed for the states of all layers to span `bytes` (>> the last-level cache).
  static int LayersFor(int64_t n, int heads, int k_dim, int64_t bytes);

  int num_layers;
  TokenInputs in;
  std::vector<float> states;
  std::vector<int32_t> indices;
  RecurrentKdaCall call;  // [N, tokens, H, K] tokens; initial_state: layer 0's [N, H, K, V] states
};

// fla's options at the layer's scale: a packed batch of sequences of the
// given lengths with H query/key heads, HV value heads and head dims K, V, in
// `dtype` (g and beta fp32), with contiguous states; the same tokens as a
// chunk_kda call, a fused_recurrent_kda call (several tokens per sequence,
// the final states back into the initial ones), and a speculative
// verification step (a pool slot per token through 2-D indices, every draft
// accepted). g is [T, HV, K] (KDA), or [T, HV] with `scalar_gate` (Gated
// DeltaNet: one decay per value head).
struct FlaProblem {
  FlaProblem(const std::vector<int64_t>& lengths, int heads, int value_heads, int k_dim, int v_dim, DType dtype,
             uint32_t seed = 1, bool scalar_gate = false);
  FlaProblem(const FlaProblem&) = delete;
  FlaProblem& operator=(const FlaProblem&) = delete;
  int64_t T() const { return cu.back(); }
  int64_t N() const { return static_cast<int64_t>(cu.size()) - 1; }
  std::vector<int64_t> cu;
  TypedBuffer q, k, v, g, beta, o;
  std::vector<float> initial, final_state, pool;
  std::vector<int32_t> slots, accepted;  // [N, C] slots per token, [N] accepted counts
  ChunkKdaCall chunk;
  RecurrentKdaCall recurrent;
  RecurrentKdaCall speculative;
};

}  // namespace kda::bench
