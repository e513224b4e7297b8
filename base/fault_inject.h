// Fault injection, to test how failures end (README, "Tensor and data
// parallelism"). The environment variable
//
//   KDA_FAULT_INJECT=rank:R,at:POINT[,skip:N]
//
// makes the process of world rank R (OMPI_COMM_WORLD_RANK / PMIX_RANK /
// PMI_RANK; 0 outside an MPI launcher) fail once at POINT, after passing it N
// times (default 0; 1 for forward and kill, so that the fault comes mid-run):
//
//   load     kda::Error while loading the model's weights (as a bad shard would)
//   alloc    std::bad_alloc when the state pool allocates its slots
//   forward  kda::Error before a layer's forward (its peers are then in that
//            layer's all-reduce)
//   kill     SIGKILL to itself at the same point as forward (a dying rank)
//
// Unset, nothing happens. A malformed value is a kda::Error at the first
// check.
#pragma once

#include <string>

namespace kda {

enum class FaultPoint { kLoad, kAlloc, kForward };

// Fails here if KDA_FAULT_INJECT (or SetFaultInjection) names this rank and
// point and the point has been passed `skip` times. Call it outside parallel
// regions.
void MaybeInjectFault(FaultPoint point);

// Replaces the KDA_FAULT_INJECT setting for this process (tests); "" turns
// injection off. Resets the pass counts.
void SetFaultInjection(const std::string& spec);

}  // namespace kda
