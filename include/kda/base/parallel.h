// A small parallel-for over OpenMP, so kernels and layers never name OpenMP
// directly.
#pragma once

#include <cstdint>
#include <functional>

namespace kda {

// Sets the number of worker threads used by ParallelFor and by the GEMM
// library (n <= 0 keeps the current setting).
void SetNumThreads(int n);
int NumThreads();

// Calls fn(i) for every i in [0, n), spread over the worker threads. fn must
// be safe to run concurrently for distinct i and must not throw (validate
// inputs before the loop).
void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace kda
