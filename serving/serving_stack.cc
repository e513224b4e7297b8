#include "kda/serving/serving_stack.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "kda/base/error.h"

namespace kda {

void ValidateServingOptions(const ServingOptions& options, OptionNames names) {
  ValidateSchedulerConfig(options.scheduler, names);
  Check(options.scheduler.prefix_cache == nullptr,
        "serving options: the stack makes the prefix cache (set prefix_cache_bytes)");
  // The CLI takes the byte budgets in MiB: a value is told back in the unit it was given in.
  const auto budget = [names](int64_t bytes, const char* field, const char* meaning) {
    Check(bytes >= 0, [&] {
      std::string value = std::to_string(bytes);
      if (names == OptionNames::kFlags) {
        char mib[32];
        std::snprintf(mib, sizeof(mib), "%g MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
        value = mib;
      }
      return OptionName(field, names) + " must be >= 0 (" + meaning + "), got " + value;
    });
  };
  budget(options.state_budget_bytes, "state_budget_bytes", "0: no limit");
  budget(options.prefix_cache_bytes, "prefix_cache_bytes", "0: off");
  const int64_t k = options.verify.max_draft_tokens;
  Check(k >= 0 && k <= 64, [&] {
    return OptionName("max_draft_tokens", names) + " must be in [0, 64] (0: no speculative verify), got " +
           std::to_string(k);
  });
}

int64_t ServingCapacity(const DeltaRuleModel& model, const ServingOptions& options, int64_t requests) {
  Check(requests >= 0, "serving: a negative request count");
  int64_t slots = options.scheduler.max_running;
  if (requests > 0) slots = slots > 0 ? std::min(slots, requests) : requests;
  const auto fit = [&] {
    return RecurrentStatePool::MaxRequestsForBudget(options.state_budget_bytes, model.num_layers(), model.state_spec(),
                                                    model.act_dtype, options.verify);
  };
  if (slots == 0) {
    Check(options.state_budget_bytes > 0,
          "max_running 0 needs a known number of requests or a state budget to size the state pool");
    return fit();
  }
  return options.state_budget_bytes > 0 ? std::min(slots, fit()) : slots;
}

ServingStack::ServingStack(const DeltaRuleModel& model, const ServingOptions& options, int64_t requests) {
  ValidateServingOptions(options);
  const int64_t capacity = ServingCapacity(model, options, requests);
  const int L = model.num_layers();
  pool_ = std::make_unique<RecurrentStatePool>(L, capacity, model.state_spec(), model.act_dtype, options.verify);
  req_pool_ = std::make_unique<HybridReqToTokenPool>(pool_.get());
  SchedulerConfig config = options.scheduler;
  config.max_running = capacity;
  if (options.prefix_cache_bytes > 0) {
    cache_.emplace(L, model.state_spec(), model.act_dtype, options.prefix_cache_bytes);
    config.prefix_cache = &*cache_;
  }
  runner_ = std::make_unique<ModelRunner>(model, MemoryPools{pool_.get(), req_pool_.get()}, options.kernel);
  runner_->SetObserver(options.observer);
  scheduler_ = std::make_unique<Scheduler>(*runner_, config);
}

}  // namespace kda
