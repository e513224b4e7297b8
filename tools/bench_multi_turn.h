// `kda bench --workload multi-turn`: multi-turn chat with a shared system
// prompt, served with the prefix cache off and on in one invocation.
#pragma once

#include "kda/base/dtype.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/kernels/q8.h"
#include "tools/bench_command.h"

namespace kda::cli {

// Prints the report (and the JSON line with --json); returns the exit status
// (1 when the cache-on run does not match the cache-off run).
int RunMultiTurnBench(const BenchOptions& opt, DType dtype, WeightFormat weights, KernelImpl kernel);

}  // namespace kda::cli
