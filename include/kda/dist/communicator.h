// Collective communication between the ranks of a tensor- or data-parallel
// group. Kernels and layers see only this interface; the MPI implementation
// lives behind it.
#pragma once

#include <cstdint>

namespace kda {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks of `n` fp32 values.
  virtual void AllReduceSum(float* data, int64_t n) = 0;
};

// One process: every collective is the identity.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float* /*data*/, int64_t /*n*/) override {}
};

}  // namespace kda
