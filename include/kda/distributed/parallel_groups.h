// Tensor- and data-parallel groups of one job, and the runtime a command runs
// in (one process, or an MPI job of tp x dp ranks).
//
// Convention: world rank = dp_rank * tp + tp_rank. The tp group holds the tp
// ranks of one data-parallel index (consecutive world ranks: they split the
// heads of every layer); the dp group holds the dp ranks of one tp index
// (each dp rank owns a share of the requests and its own state pool).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "kda/base/error.h"
#include "kda/distributed/communicator.h"

namespace kda {

class ParallelGroups {
 public:
  // Collective over `world` (which must outlive the groups). world.size()
  // must equal tp * dp: otherwise a kda::Error on every rank, before any
  // communication.
  ParallelGroups(Communicator& world, int tp, int dp);

  Communicator& world() const { return *world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& dp() const { return *dp_; }
  int tp_size() const { return tp_size_; }
  int dp_size() const { return dp_size_; }
  int tp_rank() const { return world_->rank() % tp_size_; }
  int dp_rank() const { return world_->rank() / tp_size_; }
  bool is_root() const { return world_->rank() == 0; }

 private:
  Communicator* world_;
  int tp_size_;
  int dp_size_;
  std::unique_ptr<Communicator> tp_;
  std::unique_ptr<Communicator> dp_;
};

// A kda::Error that every rank of the world threw together (see
// ParallelRuntime::RunAgreed), so every rank can shut down cleanly.
class CollectiveError : public Error {
 public:
  using Error::Error;
  // `own`: what this rank's work threw (empty when it succeeded).
  CollectiveError(const std::string& what, std::string own) : Error(what), own_(std::move(own)) {}

  // Whether this rank's own work failed (its message: own_message()), or
  // only another rank's.
  bool failed_here() const { return !own_.empty(); }
  const std::string& own_message() const { return own_; }

 private:
  std::string own_;
};

// The process group a command runs in. One process when tp * dp == 1 and no
// MPI launcher started us: MPI is never touched. Otherwise MPI is started
// (unless it already runs) and finalized at process exit, so that every rank
// reports its error before any rank leaves (mpirun ends the whole job when
// one rank exits with an error).
class ParallelRuntime {
 public:
  // kda::Error (on every rank alike) when tp or dp < 1, when tp * dp > 1 but
  // no MPI launcher started this process, or when the MPI world size is not
  // tp * dp.
  static std::unique_ptr<ParallelRuntime> Start(int tp, int dp);

  // Destroys the groups. While an exception that was not agreed through
  // RunAgreed unwinds a multi-rank job, it aborts the job (the other ranks
  // may be waiting in a collective this rank will never join).
  ~ParallelRuntime();
  ParallelRuntime(const ParallelRuntime&) = delete;
  ParallelRuntime& operator=(const ParallelRuntime&) = delete;

  const ParallelGroups& groups() const { return *groups_; }
  bool uses_mpi() const { return mpi_; }
  // More than one process: an error on one rank alone must end the job
  // (Abort) or be agreed (RunAgreed), or the others may wait forever.
  bool multi_rank() const { return world_ != nullptr && world_->size() > 1; }
  // Ends the whole job now with `code` (Communicator::Abort on the world).
  [[noreturn]] void Abort(int code);

  // Runs `fn` on every rank, then agrees on the outcome: when any rank threw
  // (kda::Error or another std::exception), every rank throws a
  // CollectiveError with the message of the lowest failing rank (plus
  // " (on rank r)" when not every rank failed). `fn` may
  // call collectives only where every rank that shares them fails or
  // succeeds alike (errors that depend only on the common input); a failure
  // between its collectives and the agreement is a mismatch MPI may not
  // survive: work with collectives (serving, layer forwards) runs outside
  // RunAgreed, and an error there ends the job through Abort. Each rank's
  // CollectiveError also says whether its own `fn` failed and with what. In
  // one process, `fn` runs unwrapped.
  void RunAgreed(const std::function<void()>& fn);

 private:
  ParallelRuntime() = default;

  std::unique_ptr<Communicator> world_;
  std::unique_ptr<ParallelGroups> groups_;
  bool mpi_ = false;
  bool agreed_failure_ = false;
  int uncaught_at_start_ = 0;
};

}  // namespace kda
