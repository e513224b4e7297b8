// The MPI test program's world (tests/distributed_mpi_main.cc): every rank runs
// every test, so a test's collectives must not depend on an assertion that
// could fail on one rank only (check results after the last collective).
#pragma once

#include "kda/distributed/communicator.h"

namespace kda::testing {

// MPI_COMM_WORLD of the test job; valid for the whole run.
Communicator& MpiWorld();

}  // namespace kda::testing
