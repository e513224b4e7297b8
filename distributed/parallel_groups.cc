#include "kda/distributed/parallel_groups.h"

#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "kda/distributed/mpi_communicator.h"

namespace kda {
namespace {

std::string Layout(int tp, int dp) {
  return "--tp " + std::to_string(tp) + " x --dp " + std::to_string(dp) + " = " + std::to_string(tp * dp) + " ranks";
}

void FinalizeMpiAtExit() { FinalizeMpi(); }

}  // namespace

ParallelGroups::ParallelGroups(Communicator& world, int tp, int dp) : world_(&world), tp_size_(tp), dp_size_(dp) {
  Check(tp >= 1 && dp >= 1, "--tp and --dp must be >= 1, got " + std::to_string(tp) + " and " + std::to_string(dp));
  Check(world.size() == tp * dp, Layout(tp, dp) + ", but the job has " + std::to_string(world.size()) +
                                     " processes (launch with mpirun -np " + std::to_string(tp * dp) + ")");
  // Same dp index: one tp group ranked by tp index; same tp index: one dp group.
  tp_ = world.Split(dp_rank(), tp_rank());
  dp_ = world.Split(tp_rank(), dp_rank());
}

std::unique_ptr<ParallelRuntime> ParallelRuntime::Start(int tp, int dp) {
  Check(tp >= 1, "--tp must be >= 1, got " + std::to_string(tp));
  Check(dp >= 1, "--dp must be >= 1, got " + std::to_string(dp));
  const bool launched = LaunchedByMpiLauncher();
  Check(launched || tp * dp == 1, Layout(tp, dp) + ", but this is a single process not started by mpirun (launch " +
                                      "it with mpirun -np " + std::to_string(tp * dp) + ")");
  std::unique_ptr<ParallelRuntime> rt(new ParallelRuntime());
  rt->uncaught_at_start_ = std::uncaught_exceptions();
  if (!launched) {
    rt->world_ = std::make_unique<SingleProcessCommunicator>();
  } else {
    rt->mpi_ = true;
    const bool starts_mpi = !MpiRunning();
    rt->world_ = MpiCommunicator::World();
    // Finalized at exit, after the caller has reported any error: MPI_Finalize
    // waits for every rank, so no rank leaves (and has mpirun end the job)
    // before each one has said why it stops.
    if (starts_mpi) std::atexit(FinalizeMpiAtExit);
    if (rt->world_->size() != tp * dp) {
      // The same on every rank (all see the same flags and world size).
      const int size = rt->world_->size();
      rt->world_.reset();
      rt->mpi_ = false;
      throw Error(Layout(tp, dp) + ", but mpirun started " + std::to_string(size) + " processes (use mpirun -np " +
                  std::to_string(tp * dp) + ")");
    }
  }
  rt->groups_ = std::make_unique<ParallelGroups>(*rt->world_, tp, dp);
  return rt;
}

ParallelRuntime::~ParallelRuntime() {
  const bool unagreed_failure = std::uncaught_exceptions() > uncaught_at_start_ && !agreed_failure_;
  const bool multi_rank = world_ != nullptr && world_->size() > 1;
  groups_.reset();
  world_.reset();
  // Another rank may be blocked in a collective this rank will never join:
  // finalizing would wait for it forever.
  if (mpi_ && unagreed_failure && multi_rank) AbortMpi(1);
}

void ParallelRuntime::Abort(int code) {
  if (world_ != nullptr) world_->Abort(code);
  AbortMpi(code);
}

void ParallelRuntime::RunAgreed(const std::function<void()>& fn) {
  Communicator& world = *world_;
  if (!mpi_) {
    fn();
    return;
  }
  std::string message;
  bool failed = false;
  try {
    fn();
  } catch (const Error& e) {
    message = e.what();
    failed = true;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    failed = true;
  }
  const int n = world.size();
  std::vector<float> flags(static_cast<size_t>(n), 0.0F);  // exact: sums of 0/1
  flags[world.rank()] = failed ? 1.0F : 0.0F;
  world.AllReduceSum(flags.data(), n);
  int first = -1;
  int count = 0;
  for (int r = 0; r < n; ++r) {
    if (flags[r] > 0.5F) {
      if (first < 0) first = r;
      ++count;
    }
  }
  if (first < 0) return;
  std::string own = message.empty() ? std::string("unknown error") : message;
  int64_t len = world.rank() == first ? static_cast<int64_t>(message.size()) : 0;
  world.Broadcast(&len, sizeof(len), first);
  message.resize(static_cast<size_t>(len));
  world.Broadcast(message.data(), len, first);
  std::string agreed = message;
  if (count < n) agreed += " (on rank " + std::to_string(first) + ")";
  agreed_failure_ = true;
  throw CollectiveError(agreed, failed ? std::move(own) : std::string());
}

}  // namespace kda
