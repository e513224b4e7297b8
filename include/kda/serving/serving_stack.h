// One serving assembly: the state pool (sized by the options), the request ->
// slot map, the runner with its backend, the prefix cache and the scheduler,
// built in one place from one validated ServingOptions. The CLI (through
// ServeParallel), Python's Engine and Layer, the benchmarks and the replay all
// build their servers here, so an option means the same in every front end.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/attention/linear/delta_rule_backend.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/radix_state_cache.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/models/delta_rule_model.h"
#include "kda/serving/model_runner.h"
#include "kda/serving/scheduler.h"

namespace kda {

// The rule of each option, once (ValidateServingOptions):
//   scheduler.max_running       >= 0: requests holding a slot at once; 0: every request the server is made
//                               for, or as many as state_budget_bytes holds when that count is not known
//   scheduler.prefill_chunk     >= 0 (0: no limit); scheduler.step_token_budget >= 1
//   scheduler.snapshot_interval a positive multiple of 64; scheduler.prefix_cache left null (the stack
//                               makes its own from prefix_cache_bytes)
//   state_budget_bytes          >= 0 (0: no limit): the pool holds as many requests as fit, verify areas counted
//   prefix_cache_bytes          >= 0 (0: off)
//   verify.max_draft_tokens     in [0, 64]
struct ServingOptions {
  SchedulerConfig scheduler{};
  int64_t state_budget_bytes = 0;
  int64_t prefix_cache_bytes = 0;
  VerifyConfig verify{};
  KernelImpl kernel = KernelImpl::kAuto;
  LayerObserver* observer = nullptr;  // set on the runner (see LayerObserver); not owned
};

// kda::Error naming the first option that breaks its rule.
void ValidateServingOptions(const ServingOptions& options, OptionNames names = OptionNames::kFields);

// The pool's slots for `requests` requests (0: not known ahead): max_running
// (0: `requests`), bounded by `requests` and by what the state budget holds.
// kda::Error when nothing bounds it (max_running, requests and the budget all
// 0) or not one request fits the budget.
int64_t ServingCapacity(const DeltaRuleModel& model, const ServingOptions& options, int64_t requests = 0);

class ServingStack {
 public:
  // A server for `model` (which must outlive it) with ServingCapacity's
  // slots; validates the options first.
  ServingStack(const DeltaRuleModel& model, const ServingOptions& options, int64_t requests = 0);
  ServingStack(const ServingStack&) = delete;
  ServingStack& operator=(const ServingStack&) = delete;

  Scheduler& scheduler() { return *scheduler_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  ModelRunner& runner() { return *runner_; }
  RecurrentStatePool& pool() { return *pool_; }
  const RecurrentStatePool& pool() const { return *pool_; }
  HybridReqToTokenPool& req_pool() { return *req_pool_; }
  // Null when prefix_cache_bytes is 0.
  const RadixStateCache* prefix_cache() const { return cache_ ? &*cache_ : nullptr; }
  int64_t capacity() const { return pool_->capacity(); }

 private:
  // Declared in the order they are built (and destroyed in reverse: the scheduler first).
  std::unique_ptr<RecurrentStatePool> pool_;
  std::unique_ptr<HybridReqToTokenPool> req_pool_;
  std::optional<RadixStateCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace kda
