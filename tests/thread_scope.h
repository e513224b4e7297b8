// Test helper: runs a scope with a given worker thread count (kda's OpenMP
// threads) and restores the previous count when it ends.
#pragma once

#include "kda/base/parallel.h"

namespace kda::testing {

class ThreadScope {
 public:
  explicit ThreadScope(int threads) : saved_(NumThreads()) { SetNumThreads(threads); }
  ~ThreadScope() { SetNumThreads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

}  // namespace kda::testing
