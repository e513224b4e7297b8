// `kda bench --workload speculative`: TARGET_VERIFY steps with seeded drafts
// against plain decode steps, per batch, weights format, k and alpha.
#pragma once

#include "kda/base/dtype.h"
#include "kda/kernels/kda_dispatch.h"
#include "tools/bench_command.h"

namespace kda::cli {

// Prints the report (one JSON line per configuration with --json); returns
// the exit status (1 when a self-check fails).
int RunSpeculativeBench(const BenchOptions& opt, DType dtype, KernelImpl kernel);

}  // namespace kda::cli
