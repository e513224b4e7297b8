// Serving across tensor- and data-parallel ranks (design §4): each
// data-parallel rank serves its share of the requests through its own pool;
// the tensor-parallel ranks of one data-parallel index serve the same
// requests, each with the states of its heads. The results come back to
// world rank 0 in request order, with the states of all heads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kda/distributed/parallel_groups.h"
#include "kda/kernels/gemm_route.h"
#include "kda/serving/scheduler.h"
#include "kda/serving/serving_stack.h"

namespace kda {

// Which data-parallel rank serves each request (tokens[i]: request i's rows):
// in order, each request goes to the rank with the fewest tokens so far
// (ties: the lowest rank). Deterministic, so every rank computes the same split.
std::vector<int> AssignRequestsToDpRanks(const std::vector<int64_t>& tokens, int dp_size);

// One request's states over L layers, the full model's vs one tensor-parallel
// shard's (`geometry`: the full layer's; the shard: key heads
// [begin, begin + count) and their value heads):
//   recurrent  full [L, HV, K, V] fp32      shard [L, count * r, K, V]
//   conv       full [L, W-1, C]             shard [L, W-1, C_shard]
// Conv channels are q|k|v, each head-major (H*K, H*K, HV*V wide in the full
// layout; the shard's heads' channels in the shard's); conv elements are
// `elem_size` bytes (the activation dtype). Extract* cut a shard out of full
// states; Place* write a shard into its part of full states.
std::vector<float> ExtractRecurrentShard(const float* full, int L, const DeltaRuleGeometry& geometry,
                                         const HeadShard& shard);
std::vector<uint8_t> ExtractConvShard(const void* full, size_t elem_size, int L, const DeltaRuleGeometry& geometry,
                                      const HeadShard& shard);
void PlaceRecurrentShard(const float* shard_states, float* full, int L, const DeltaRuleGeometry& geometry,
                         const HeadShard& shard);
void PlaceConvShard(const void* shard_states, void* full, size_t elem_size, int L, const DeltaRuleGeometry& geometry,
                    const HeadShard& shard);

// The serving options of each rank (ServingStack): max_running and
// state_budget_bytes per data-parallel rank (max_running 0: its whole share),
// each data-parallel rank its own prefix cache of prefix_cache_bytes over its
// heads (requests need token ids); requests with a DraftSource are verified
// with drafts when verify has a draft count.
struct ParallelServeOptions : ServingOptions {
  bool gather = true;  // bring every result to world rank 0 (GatherResults)
};

struct ParallelServeResult {
  std::vector<RequestResult> local;     // this rank's requests by id; states of its heads only
  std::vector<RequestResult> gathered;  // world rank 0 when gathering: every request by id, full states
  std::vector<StepRecord> steps;        // this rank's scheduler steps
  std::vector<std::string> notes;       // this rank's scheduler notes
  int64_t pool_capacity = 0;            // this rank's state pool: usable slots
  int64_t pool_bytes = 0;               // and its bytes (dummy slot included)
  int64_t cache_hit_tokens = 0;         // this rank's rows reused from its prefix cache
  int64_t snapshot_bytes_peak = 0;      // the most bytes its prefix cache held
};

// Collective over the world: every rank's `local` results (ServeParallel
// without gathering) at world rank 0, by id, with the states of all heads
// (the full layouts); empty on the other ranks.
std::vector<RequestResult> GatherResults(const DeltaRuleModel& model, const ParallelGroups& groups,
                                         std::vector<RequestResult> local);

// The projections' GEMM routes (kda/kernels/gemm_route.h, one per class of
// rows) of world rank 0, set on every rank, so that a job's ranks sum in one
// order and report one plan; where some rank cannot run rank 0's route for a
// class, the tiles fall back to the bf16 dot and the bf16 dot to fp32_fma.
// kda::Error on every rank when some rank's KDA_GEMM_ROUTE is invalid.
// Collective over `world`; ServeParallel calls it first.
GemmPlan AgreeGemmPlan(Communicator& world);

// Serves `requests` (every request of the job, the same list on every rank,
// distinct ids) over `groups` with `model`, this rank's tensor-parallel shard
// (model.tp the groups' tp communicator, or null when tp = 1). Initial states,
// when given, are in the full layouts above (fp32 and the activation dtype);
// each rank takes its heads' part. Collective over the world.
ParallelServeResult ServeParallel(const DeltaRuleModel& model, const ParallelGroups& groups,
                                  const std::vector<ServeRequest>& requests, const ParallelServeOptions& options);

}  // namespace kda
