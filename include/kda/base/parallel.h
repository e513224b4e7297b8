// A small parallel-for over OpenMP, so kernels and layers never name OpenMP
// directly.
#pragma once

#include <cstdint>

namespace kda {

// Sets the number of worker threads used by ParallelFor and by the GEMM
// library (n <= 0 keeps the current setting).
void SetNumThreads(int n);
int NumThreads();

namespace internal {

// The loop of ParallelFor over a type-erased body: call(fn, i) for i in [0, n).
void ParallelForErased(int64_t n, void (*call)(const void* fn, int64_t i), const void* fn);

}  // namespace internal

// Calls fn(i) for every i in [0, n), spread over the worker threads. fn must
// be safe to run concurrently for distinct i and must not throw (validate
// inputs before the loop). fn is called through a pointer, never copied: a
// call allocates nothing (a std::function would, for a lambda capturing more
// than two references, on every decode step).
template <class Fn>
void ParallelFor(int64_t n, const Fn& fn) {
  internal::ParallelForErased(
      n, [](const void* f, int64_t i) { (*static_cast<const Fn*>(f))(i); }, &fn);
}

}  // namespace kda
