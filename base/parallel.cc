#include "kda/base/parallel.h"

#include <omp.h>

namespace kda {

void SetNumThreads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

int NumThreads() { return omp_get_max_threads(); }

namespace internal {

void ParallelForErased(int64_t n, void (*call)(const void* fn, int64_t i), const void* fn) {
  if (n <= 0) return;
  if (n == 1 || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) call(fn, i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) call(fn, i);
}

}  // namespace internal

}  // namespace kda
