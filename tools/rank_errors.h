// How a `kda` command reports an error and ends, in one process and on each
// rank of an MPI job.
#pragma once

#include <exception>
#include <functional>

#include "kda/distributed/parallel_groups.h"

namespace kda::cli {

// Prints the one stderr line for exception `e` ("kda: error: ..." for a
// kda::Error or an allocation failure, "kda: internal error: ..." otherwise;
// with "rank R: " after the colon when `rank` >= 0) and returns the exit
// status (1, or 3 for an internal error).
int ReportException(const std::exception_ptr& e, int rank = -1);

// Runs a command's work on this process and returns its exit status. Under a
// multi-rank job an error ends the job promptly:
// - agreed by every rank (ParallelRuntime::RunAgreed, e.g. a shard that only
//   one rank fails to read): the ranks where it happened print their line,
//   the others none, and every rank returns 1 (MPI finalizes normally);
// - anything else (e.g. a failure inside a layer forward while the other
//   ranks wait in its all-reduce): this rank prints its line and aborts the
//   whole job (Communicator::Abort, MPI_Abort) with the line's status.
// In one process, errors pass through to the caller.
int RunOnRanks(ParallelRuntime& rt, const std::function<int()>& work);

}  // namespace kda::cli
