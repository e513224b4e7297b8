#include "kda/bench/kernel_problems.h"

#include <algorithm>
#include <cmath>

namespace kda::bench {
namespace {

// A call over `in` as `rows` batch rows of `t` tokens of H heads of K = V,
// with the layer's options.
template <class Call>
Call LayerCall(TokenInputs& in, int64_t rows, int64_t t, int64_t heads, int64_t k_dim) {
  const auto tokens = [&](const TypedBuffer& b) { return b.View({rows, t, heads, k_dim}); };
  Call c;
  c.o = in.o.MutView({rows, t, heads, k_dim});
  c.q = tokens(in.q);
  c.k = tokens(in.k);
  c.v = tokens(in.v);
  c.g = tokens(in.g);
  c.beta = in.beta.View({rows, t, heads});
  c.use_qk_l2norm_in_kernel = true;  // as the KDA layer calls the kernels
  return c;
}

}  // namespace

TypedBuffer::TypedBuffer(const std::vector<float>& x, DType dtype) : dtype_(dtype) {
  if (dtype == DType::kF32) {
    f32_ = ScratchArray<float>(x.size());
    std::copy(x.begin(), x.end(), f32_.data());
  } else {
    half_ = ScratchArray<uint16_t>(x.size());
    for (size_t i = 0; i < x.size(); ++i) StoreFromFloat(half_.data(), dtype, i, x[i]);
  }
}

TokenInputs::TokenInputs(int64_t rows, int k_dim, DType dtype, uint32_t seed)
    : q(Random(rows * k_dim, seed, 1.0F), dtype),
      k(Random(rows * k_dim, seed + 1, 1.0F), dtype),
      v(Random(rows * k_dim, seed + 2, 1.0F), dtype),
      g(Gates(rows * k_dim, seed + 3), DType::kF32),
      beta(Betas(rows, seed + 4), DType::kF32),
      o(std::vector<float>(static_cast<size_t>(rows * k_dim), 0.0F), dtype) {}

std::vector<float> TokenInputs::Random(int64_t n, uint32_t seed, float scale) {
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

std::vector<float> TokenInputs::Gates(int64_t n, uint32_t seed) {
  std::vector<float> x = Random(n, seed, 1.0F);
  for (float& e : x) e = -std::exp(-3.5F + e);
  return x;
}

std::vector<float> TokenInputs::Betas(int64_t n, uint32_t seed) {
  std::vector<float> x = Random(n, seed, 1.0F);
  for (float& e : x) e = 1.0F / (1.0F + std::exp(-e));
  return x;
}

ChunkProblem::ChunkProblem(const std::vector<int64_t>& lengths, int heads, int k_dim, DType dtype, uint32_t seed)
    : cu(CuSeqlens(lengths)),
      in(cu.back() * heads, k_dim, dtype, seed),
      initial(TokenInputs::Random(static_cast<int64_t>(lengths.size()) * heads * k_dim * k_dim, seed + 5, 0.1F)),
      final_state(initial.size(), 0.0F) {
  const auto n = static_cast<int64_t>(lengths.size());
  call = LayerCall<ChunkKdaCall>(in, 1, cu.back(), heads, k_dim);
  call.cu_seqlens = ContiguousView<const void*>(cu.data(), DType::kI64, {n + 1});
  call.initial_state = ContiguousView<const void*>(initial.data(), DType::kF32, {n, heads, k_dim, k_dim});
  call.output_final_state = true;
  call.final_state = ContiguousView<void*>(final_state.data(), DType::kF32, {n, heads, k_dim, k_dim});
}

std::vector<int64_t> ChunkProblem::CuSeqlens(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

DecodeProblem::DecodeProblem(int64_t n, int heads, int k_dim, int layers, DType dtype, uint32_t seed, int64_t tokens)
    : num_layers(std::max(1, layers)),
      in(n * tokens * heads, k_dim, dtype, seed),
      states(TokenInputs::Random(num_layers * n * heads * k_dim * k_dim, seed + 5, 0.1F)),
      indices(static_cast<size_t>(n)) {
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  call = LayerCall<RecurrentKdaCall>(in, n, tokens, heads, k_dim);
  call.initial_state = ContiguousView<void*>(states.data(), DType::kF32, {n, heads, k_dim, k_dim});
  call.ssm_state_indices = ContiguousView<const void*>(indices.data(), DType::kI32, {n});
}

int DecodeProblem::LayersFor(int64_t n, int heads, int k_dim, int64_t bytes) {
  const int64_t per_layer = n * heads * k_dim * k_dim * static_cast<int64_t>(sizeof(float));
  return static_cast<int>(std::max<int64_t>(1, (bytes + per_layer - 1) / per_layer));
}

FlaProblem::FlaProblem(const std::vector<int64_t>& lengths, int heads, int value_heads, int k_dim, int v_dim,
                       DType dtype, uint32_t seed, bool scalar_gate)
    : cu(ChunkProblem::CuSeqlens(lengths)),
      q(TokenInputs::Random(cu.back() * heads * k_dim, seed, 1.0F), dtype),
      k(TokenInputs::Random(cu.back() * heads * k_dim, seed + 1, 1.0F), dtype),
      v(TokenInputs::Random(cu.back() * value_heads * v_dim, seed + 2, 1.0F), dtype),
      g(TokenInputs::Gates(cu.back() * value_heads * (scalar_gate ? 1 : k_dim), seed + 3), DType::kF32),
      beta(TokenInputs::Betas(cu.back() * value_heads, seed + 4), DType::kF32),
      o(std::vector<float>(static_cast<size_t>(cu.back() * value_heads * v_dim), 0.0F), dtype),
      initial(TokenInputs::Random(N() * value_heads * k_dim * v_dim, seed + 5, 0.1F)),
      final_state(initial.size(), 0.0F) {
  const int64_t n = N();
  const int64_t t = T();
  auto tokens = [&](KdaCallCommon& c) {
    c.o = o.MutView({1, t, value_heads, v_dim});
    c.q = q.View({1, t, heads, k_dim});
    c.k = k.View({1, t, heads, k_dim});
    c.v = v.View({1, t, value_heads, v_dim});
    c.g = scalar_gate ? g.View({1, t, value_heads}) : g.View({1, t, value_heads, k_dim});
    c.beta = beta.View({1, t, value_heads});
    c.use_qk_l2norm_in_kernel = true;
    c.cu_seqlens = ContiguousView<const void*>(cu.data(), DType::kI64, {n + 1});
  };
  tokens(chunk);
  chunk.initial_state = ContiguousView<const void*>(initial.data(), DType::kF32, {n, value_heads, k_dim, v_dim});
  chunk.output_final_state = true;
  chunk.final_state = ContiguousView<void*>(final_state.data(), DType::kF32, {n, value_heads, k_dim, v_dim});
  tokens(recurrent);
  recurrent.initial_state = ContiguousView<void*>(final_state.data(), DType::kF32, {n, value_heads, k_dim, v_dim});
  // Speculative verification: sequence n's tokens each get a slot of the pool (C = the longest sequence),
  // every draft accepted: the step starts from slot [n, 0].
  int64_t cols = 1;
  for (int64_t len : lengths) cols = std::max(cols, len);
  pool = TokenInputs::Random(n * cols * value_heads * k_dim * v_dim, seed + 6, 0.1F);
  slots.resize(static_cast<size_t>(n * cols));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
  accepted.assign(static_cast<size_t>(n), 1);
  tokens(speculative);
  speculative.initial_state = ContiguousView<void*>(pool.data(), DType::kF32, {n * cols, value_heads, k_dim, v_dim});
  speculative.ssm_state_indices = ContiguousView<const void*>(slots.data(), DType::kI32, {n, cols});
  speculative.num_accepted_tokens = ContiguousView<const void*>(accepted.data(), DType::kI32, {n});
}

}  // namespace kda::bench
