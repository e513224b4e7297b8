#include "kda/distributed/communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kda/base/error.h"

namespace kda {

void Communicator::AllReduceSumBF16(BF16* data, int64_t n) {
  std::vector<float> sum(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sum[i] = ToFloat(data[i]);
  AllReduceSum(sum.data(), n);
  for (int64_t i = 0; i < n; ++i) data[i] = ToBF16(sum[i]);
}

void Communicator::Abort(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

std::vector<std::vector<uint8_t>> SingleProcessCommunicator::Gather(const void* data, int64_t nbytes, int root) {
  Check(root == 0, "Gather: root " + std::to_string(root) + " is not a rank of a one-process group");
  Check(nbytes >= 0 && (nbytes == 0 || data != nullptr), "Gather: bad buffer");
  const auto* p = static_cast<const uint8_t*>(data);
  return {std::vector<uint8_t>(p, p + nbytes)};
}

void SingleProcessCommunicator::Broadcast(void* /*data*/, int64_t /*nbytes*/, int root) {
  Check(root == 0, "Broadcast: root " + std::to_string(root) + " is not a rank of a one-process group");
}

std::unique_ptr<Communicator> SingleProcessCommunicator::Split(int /*color*/, int /*key*/) {
  return std::make_unique<SingleProcessCommunicator>();
}

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void TimedCommunicator::Abort(int code) {
  inner_->Abort(code);
  Communicator::Abort(code);  // not reached: the inner communicator ends the process
}

template <class T>
void TimedCommunicator::TimedAllReduce(void (Communicator::*all_reduce)(T*, int64_t), T* data, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  (inner_->*all_reduce)(data, n);
  allreduce_seconds_ += Since(t0);
  ++allreduce_calls_;
  allreduce_bytes_ += n * static_cast<int64_t>(sizeof(T));
}

void TimedCommunicator::AllReduceSum(float* data, int64_t n) { TimedAllReduce(&Communicator::AllReduceSum, data, n); }

void TimedCommunicator::AllReduceSumBF16(BF16* data, int64_t n) {
  TimedAllReduce(&Communicator::AllReduceSumBF16, data, n);
}

}  // namespace kda
