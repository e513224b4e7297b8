// `kda bench-kernels`: the KDA core kernels (chunk prefill, recurrent decode),
// reference and optimized, against the machine's measured ceilings.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace kda::cli {

struct BenchKernelsOptions {
  bool json = false;  // one JSON object per line per measurement (else a table)
  int threads = 0;    // worker threads (0: OpenMP default)
  int repeats = 9;    // timed runs per measurement (the slow reference chunk kernel runs ceil(repeats / 3))
  // The row groups to run (chunk, recurrent, layer, decode, projections, options); empty: all.
  std::vector<std::string> only;
};

// Registers the subcommand and its options (bound to `opt`); returns it so
// that the caller can check parsed().
CLI::App* AddBenchKernelsCommand(CLI::App& app, BenchKernelsOptions& opt);

// Runs the benchmark and prints it; returns the process exit status. Throws
// kda::Error on bad options.
int RunBenchKernelsCommand(const BenchKernelsOptions& opt);

}  // namespace kda::cli
