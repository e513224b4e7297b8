// Collective communication between the ranks of a tensor- or data-parallel
// group. Kernels and layers see only this interface; the MPI implementation
// (kda/distributed/mpi_communicator.h) lives behind it.
//
// Every call is collective over the group: all ranks make the same calls in
// the same order with matching sizes, from the thread that owns the
// communicator (no call from inside a parallel region).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kda/base/bf16.h"

namespace kda {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks of `n` fp32 values.
  virtual void AllReduceSum(float* data, int64_t n) = 0;
  // In-place sum over all ranks of `n` bf16 values: accumulated in fp32 and
  // rounded once to bf16, so every rank ends with the same bits.
  virtual void AllReduceSumBF16(BF16* data, int64_t n);
  // Every rank's `nbytes` bytes at `data`, in rank order, returned at `root`
  // (one vector per rank; sizes may differ by rank); empty on other ranks.
  virtual std::vector<std::vector<uint8_t>> Gather(const void* data, int64_t nbytes, int root) = 0;
  // Copies `root`'s `nbytes` bytes at `data` into `data` on every rank
  // (`nbytes` must be the same on every rank).
  virtual void Broadcast(void* data, int64_t nbytes, int root) = 0;
  virtual void Barrier() = 0;
  // A sub-group: the ranks that pass the same `color` (>= 0) form one new
  // communicator, ranked by `key` (ties by rank here). Collective.
  virtual std::unique_ptr<Communicator> Split(int color, int key) = 0;
  // Ends every process of the job with exit status `code`, at once: for an
  // error on this rank alone, while other ranks may be waiting in a
  // collective this rank will never join. Not collective. Here (one
  // process): flushes stdio and exits.
  [[noreturn]] virtual void Abort(int code);
};

// One process: every collective is the identity.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float* /*data*/, int64_t /*n*/) override {}
  void AllReduceSumBF16(BF16* /*data*/, int64_t /*n*/) override {}
  std::vector<std::vector<uint8_t>> Gather(const void* data, int64_t nbytes, int root) override;
  void Broadcast(void* /*data*/, int64_t /*nbytes*/, int root) override;
  void Barrier() override {}
  std::unique_ptr<Communicator> Split(int color, int key) override;
};

// Forwards to another communicator and adds up the wall time and bytes of its
// all-reduces (what `kda bench` reports as the all-reduce share). `inner`
// must outlive it.
class TimedCommunicator : public Communicator {
 public:
  explicit TimedCommunicator(Communicator* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void AllReduceSum(float* data, int64_t n) override;
  void AllReduceSumBF16(BF16* data, int64_t n) override;
  std::vector<std::vector<uint8_t>> Gather(const void* data, int64_t nbytes, int root) override {
    return inner_->Gather(data, nbytes, root);
  }
  void Broadcast(void* data, int64_t nbytes, int root) override { inner_->Broadcast(data, nbytes, root); }
  void Barrier() override { inner_->Barrier(); }
  std::unique_ptr<Communicator> Split(int color, int key) override { return inner_->Split(color, key); }
  [[noreturn]] void Abort(int code) override;

  double allreduce_seconds() const { return allreduce_seconds_; }
  int64_t allreduce_calls() const { return allreduce_calls_; }
  int64_t allreduce_bytes() const { return allreduce_bytes_; }
  void ResetStats() {
    allreduce_seconds_ = 0.0;
    allreduce_calls_ = 0;
    allreduce_bytes_ = 0;
  }

 private:
  // One all-reduce of n elements through `all_reduce` on the inner communicator, timed and counted.
  template <class T>
  void TimedAllReduce(void (Communicator::*all_reduce)(T*, int64_t), T* data, int64_t n);

  Communicator* inner_;
  double allreduce_seconds_ = 0.0;
  int64_t allreduce_calls_ = 0;
  int64_t allreduce_bytes_ = 0;
};

}  // namespace kda
