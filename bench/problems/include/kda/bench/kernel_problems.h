// Random KDA kernel problems for the benchmarks (bench/kernels_bench.cc and
// `kda bench-kernels`): inputs shaped like the layer's (q, k raw with the
// in-kernel L2 norm, trained-like gates, beta in (0, 1)), owned buffers, and
// the kernel arguments pointing into them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "base/scratch.h"
#include "kda/base/bf16.h"
#include "kda/base/dtype.h"
#include "kda/kernels/kda.h"

namespace kda::bench {

// A float buffer stored as F32 or BF16.
// Stored in scratch blocks, as the layer's activations are (large ones on
// huge pages).
class TypedBuffer {
 public:
  TypedBuffer(const std::vector<float>& x, DType dtype) : dtype_(dtype) {
    if (dtype == DType::kBF16) {
      bf16_ = ScratchArray<BF16>(x.size());
      for (size_t i = 0; i < x.size(); ++i) bf16_[i] = ToBF16(x[i]);
    } else {
      f32_ = ScratchArray<float>(x.size());
      std::copy(x.begin(), x.end(), f32_.data());
    }
  }
  ConstBuf Const() const {
    return {dtype_ == DType::kBF16 ? static_cast<const void*>(bf16_.data()) : f32_.data(), dtype_};
  }
  MutBuf Mut() { return {dtype_ == DType::kBF16 ? static_cast<void*>(bf16_.data()) : f32_.data(), dtype_}; }

 private:
  DType dtype_;
  ScratchArray<float> f32_;
  ScratchArray<BF16> bf16_;
};

// Token inputs of `rows` (token, head) rows: q, k, v, g [rows, K], beta [rows].
struct TokenInputs {
  TokenInputs(int64_t rows, int k_dim, DType dtype, uint32_t seed)
      : q(Random(rows * k_dim, seed, 1.0F), dtype),
        k(Random(rows * k_dim, seed + 1, 1.0F), dtype),
        v(Random(rows * k_dim, seed + 2, 1.0F), dtype),
        g(Gates(rows * k_dim, seed + 3), DType::kF32),
        beta(Betas(rows, seed + 4), DType::kF32),
        o(std::vector<float>(static_cast<size_t>(rows * k_dim), 0.0F), dtype) {}

  // Roughly N(0, scale^2) (a sum of four uniforms from a xorshift generator:
  // benchmarks need plausible values quickly, not a precise distribution).
  static std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
    uint64_t state = 0x9E3779B97F4A7C15ULL * (seed + 1);
    auto next = [&state] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return static_cast<float>(state >> 40) * (1.0F / 16777216.0F);  // [0, 1)
    };
    std::vector<float> x(static_cast<size_t>(n));
    const float mul = scale * std::sqrt(3.0F);
    for (float& e : x) e = (next() + next() + next() + next() - 2.0F) * mul;
    return x;
  }
  // Log decays like a trained gate: mostly slow (-exp(-3.5 + N(0, 1))).
  static std::vector<float> Gates(int64_t n, uint32_t seed) {
    std::vector<float> x = Random(n, seed, 1.0F);
    for (float& e : x) e = -std::exp(-3.5F + e);
    return x;
  }
  static std::vector<float> Betas(int64_t n, uint32_t seed) {
    std::vector<float> x = Random(n, seed, 1.0F);
    for (float& e : x) e = 1.0F / (1.0F + std::exp(-e));
    return x;
  }

  TypedBuffer q, k, v, g, beta, o;  // g and beta fp32 (as the layer passes them)
};

inline KdaOptions LayerOptions() {
  KdaOptions opt;
  opt.use_qk_l2norm_in_kernel = true;  // as the KDA layer calls the kernels
  return opt;
}

// A packed prefill batch of sequences of the given lengths, H heads of K = V.
struct ChunkProblem {
  ChunkProblem(const std::vector<int64_t>& lengths, int heads, int k_dim, DType dtype, uint32_t seed = 1)
      : cu(CuSeqlens(lengths)),
        in(cu.back() * heads, k_dim, dtype, seed),
        initial(TokenInputs::Random(static_cast<int64_t>(lengths.size()) * heads * k_dim * k_dim, seed + 5, 0.1F)),
        final_state(initial.size(), 0.0F) {
    args.o = in.o.Mut();
    args.final_state = final_state.data();
    args.q = in.q.Const();
    args.k = in.k.Const();
    args.v = in.v.Const();
    args.g = in.g.Const();
    args.beta = in.beta.Const();
    args.cu_seqlens = cu.data();
    args.initial_state = initial.data();
    args.T = cu.back();
    args.N = static_cast<int64_t>(lengths.size());
    args.H = heads;
    args.K = args.V = k_dim;
    args.options = LayerOptions();
  }
  ChunkProblem(const ChunkProblem&) = delete;
  ChunkProblem& operator=(const ChunkProblem&) = delete;

  // The q, k, v, g buffers, for HugePageFraction (the rows the kernel walks a page apart).
  std::vector<std::pair<const void*, size_t>> InputBuffers() const {
    std::vector<std::pair<const void*, size_t>> out;
    for (const ConstBuf& b : {args.q, args.k, args.v, args.g}) {
      out.emplace_back(b.data, static_cast<size_t>(args.T) * args.H * args.K * DTypeSize(b.dtype));
    }
    return out;
  }

  static std::vector<int64_t> CuSeqlens(const std::vector<int64_t>& lengths) {
    std::vector<int64_t> cu = {0};
    for (int64_t len : lengths) cu.push_back(cu.back() + len);
    return cu;
  }

  std::vector<int64_t> cu;
  TokenInputs in;
  std::vector<float> initial, final_state;
  ChunkKdaArgs args;
};

// Decode steps of N sequences (one token each) over a state buffer of
// `layers` slots of N states each ([layers * N, H, K, V]); step i uses the
// states of layer i % layers, so that with enough layers (as a model has)
// every step reads its states from memory, not from the cache.
struct DecodeProblem {
  DecodeProblem(int64_t n, int heads, int k_dim, int layers, DType dtype, uint32_t seed = 1)
      : num_layers(std::max(1, layers)),
        in(n * heads, k_dim, dtype, seed),
        states(TokenInputs::Random(num_layers * n * heads * k_dim * k_dim, seed + 5, 0.1F)),
        indices(static_cast<size_t>(n)) {
    for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    args.o = in.o.Mut();
    args.state = states.data();
    args.state_indices = indices.data();
    args.num_states = n;
    args.q = in.q.Const();
    args.k = in.k.Const();
    args.v = in.v.Const();
    args.g = in.g.Const();
    args.beta = in.beta.Const();
    args.N = n;
    args.H = heads;
    args.K = args.V = k_dim;
    args.options = LayerOptions();
  }
  DecodeProblem(const DecodeProblem&) = delete;
  DecodeProblem& operator=(const DecodeProblem&) = delete;

  // The arguments of step i.
  const RecurrentKdaArgs& Step(int64_t i) {
    const size_t per_layer = static_cast<size_t>(args.N) * args.H * args.K * args.V;
    args.state = states.data() + static_cast<size_t>(i % num_layers) * per_layer;
    return args;
  }
  // Layers needed for the states of all layers to span `bytes` (>> the last-level cache).
  static int LayersFor(int64_t n, int heads, int k_dim, int64_t bytes) {
    const int64_t per_layer = n * heads * k_dim * k_dim * static_cast<int64_t>(sizeof(float));
    return static_cast<int>(std::max<int64_t>(1, (bytes + per_layer - 1) / per_layer));
  }

  int num_layers;
  TokenInputs in;
  std::vector<float> states;
  std::vector<int32_t> indices;
  RecurrentKdaArgs args;
};

}  // namespace kda::bench
