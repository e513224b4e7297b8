// `kda run`: one KDA layer over a packed batch, from a checkpoint and an input
// file, or on the embedded default model.
#pragma once

#include <string>

namespace kda::cli {

struct RunOptions {
  std::string model_dir;  // empty: the embedded default
  std::string input;
  std::string output;
  int layer = 0;
  bool layer_given = false;  // false: the first KDA layer
  std::string dtype = "float32";
  std::string weights = "bf16";  // projection weights: bf16 (as the checkpoint) | int8
  std::string kernel = "auto";
  int threads = 0;
  // Serving: prefill chunk per sequence and step (0: one EXTEND), the last K
  // tokens of each longer sequence as DECODE steps, max sequences holding a
  // slot at once (0: all).
  int64_t prefill_chunk = 0;
  int64_t decode_last = 0;
  int64_t max_running = 0;  // per data-parallel rank
  // Recurrent prefix caching (--model only): sequences with input_ids start
  // from the deepest snapshot of their prefix that an earlier sequence left
  // (each rank caches its heads; each data-parallel rank has its own cache).
  bool prefix_cache = false;
  double prefix_cache_mib = 1024;  // per rank; 0: off
  int64_t snapshot_interval = 256;
  // Parallelism (under mpirun, tp * dp processes): tensor-parallel ranks
  // split the heads, data-parallel ranks split the sequences.
  int tp = 1;
  int dp = 1;
  // Embedded default only: sequence lengths of the packed batch.
  std::string lengths = "512,300,128,77";
};

// Returns the process exit status; throws kda::Error on bad input found
// before the ranks start. Under mpirun, later errors end the job as
// RunOnRanks (tools/rank_errors.h) says.
int RunLayerCommand(const RunOptions& opt);

}  // namespace kda::cli
