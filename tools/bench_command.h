// `kda bench`: the serving benchmark (the main job).
#pragma once

#include <cstdint>
#include <string>

#include "kda/kernels/kda_dispatch.h"
#include "kda/serving/parallel.h"

namespace kda::cli {

struct BenchOptions {
  std::string model_dir;                   // empty: the embedded default (random weights)
  std::string model_type = "kimi_linear";  // the embedded default's layer family, at its real model's shapes
  int layers = 4;                          // embedded default: number of layers; with --model: 0 = all
  int requests = 8;
  int64_t min_prompt = 64;
  int64_t max_prompt = 2048;
  int64_t decode_steps = 32;
  int64_t prefill_chunk = 512;
  int64_t step_token_budget = 4096;
  int64_t max_running = 0;      // 0: all requests
  double state_budget_mib = 0;  // state pool budget per rank (0: enough for max_running)
  std::string dtype = "bfloat16";
  std::string weights = "bf16";  // projection weights: bf16 (as the checkpoint) | int8
  std::string kernel = "auto";
  int threads = 0;
  uint64_t seed = 1;
  bool json = false;
  // Also time one layer's one-shot prefill of one sequence of max_prompt
  // tokens (as `kda bench-kernels`' layer row; same activations, bf16
  // weights, one process) and report the served prefill per layer against it.
  bool vs_one_shot = false;
  // Parallelism (under mpirun, tp * dp processes): tensor-parallel ranks
  // split the heads, data-parallel ranks split the requests (max_running is
  // per data-parallel rank).
  int tp = 1;
  int dp = 1;
  // "default", or "multi-turn": `conversations` chats of `turns` turns sharing
  // one system prompt of `system_prompt` tokens, a user message of
  // min_user..max_user tokens per turn and decode_steps decoded tokens per
  // answer; each turn's prompt is the whole conversation so far. Served with
  // the prefix cache off and on (one process).
  std::string workload = "default";
  int conversations = 8;
  int turns = 4;
  int64_t system_prompt = 1024;
  int64_t min_user = 64;
  int64_t max_user = 256;
  double prefix_cache_mib = 1024;  // the cache-on run's budget
  int64_t snapshot_interval = 256;
  // "speculative": every (batch, weights, k, alpha) of these lists served with
  // seeded drafts (each accepted with probability alpha, stopping at the
  // first rejection) against plain decode in the same run; `requests` is
  // unused, each request has spec_prompt prompt rows and decode_steps decode
  // rows; layers 0 (the command line's default for this workload) picks
  // enough layers that a step streams more weights than the last-level cache.
  std::string spec_batches = "1,8";
  std::string spec_weights = "bf16,int8";
  std::string spec_k = "1,3,7";
  std::string spec_alphas = "0.5,0.7,0.9";
  int64_t spec_prompt = 8;
  std::string verify_method = "recompute";  // recompute | token_states
};

// What the flags ask of each rank's serving stack, for every workload: max running, the state budget,
// the prefill chunk and step budget, the snapshot interval and the prefix cache's budget (used by the
// multi-turn workload's cache-on run), the kernels. ValidateServingOptions' rules hold for them.
ParallelServeOptions BenchServingOptions(const BenchOptions& opt, KernelImpl kernel);

int RunBenchCommand(const BenchOptions& opt);

}  // namespace kda::cli
