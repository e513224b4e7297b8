#include "kda/serving/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "base/act_buffer.h"
#include "kda/base/error.h"

namespace kda {

std::string OptionName(const char* field, OptionNames names) {
  if (names == OptionNames::kFields) return field;
  const std::string f = field;
  if (f == "state_budget_bytes") return "--state-budget-mib";
  if (f == "prefix_cache_bytes") return "--prefix-cache-mib";
  if (f == "step_token_budget") return "--step-tokens";
  std::string flag = "--" + f;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

void ValidateSchedulerConfig(const SchedulerConfig& config, OptionNames names) {
  const auto at_least = [names](int64_t value, int64_t least, const char* field, const char* meaning) {
    Check(value >= least, [&] {
      return OptionName(field, names) + " must be >= " + std::to_string(least) + meaning + ", got " +
             std::to_string(value);
    });
  };
  at_least(config.max_running, 0, "max_running", " (0: every request, or what the state budget holds)");
  at_least(config.prefill_chunk, 0, "prefill_chunk", " (0: no limit)");
  at_least(config.step_token_budget, 1, "step_token_budget", "");
  Check(config.snapshot_interval >= kSnapshotAlign && config.snapshot_interval % kSnapshotAlign == 0, [&] {
    return OptionName("snapshot_interval", names) + " must be a positive multiple of " +
           std::to_string(kSnapshotAlign) + ", got " + std::to_string(config.snapshot_interval);
  });
}

std::vector<std::string> CheckServerArgs(SchedulerConfig& config) {
  ValidateSchedulerConfig(config);
  std::vector<std::string> notes;
  Check(!config.enable_mixed_chunk,
        "mixed chunk (prefill and decode segments in one EXTEND batch) is not supported for KDA models");
  if (config.enable_radix_cache) {
    notes.emplace_back(
        "radix (prefix) cache disabled: KDA layers are recurrent and have no KV prefix reuse (recurrent prefix "
        "caching: a RadixStateCache, --prefix-cache-mib)");
    config.enable_radix_cache = false;
  }
  return notes;
}

Scheduler::Scheduler(ModelRunner& runner, const SchedulerConfig& config)
    : runner_(runner), pools_(runner.pools()), config_(config) {
  notes_ = CheckServerArgs(config_);
  const int64_t capacity = pools_.state_pool->capacity();
  if (config_.max_running == 0 || config_.max_running > capacity) config_.max_running = capacity;
  if (const RadixStateCache* cache = config_.prefix_cache; cache != nullptr) {
    const RecurrentStatePool& pool = *pools_.state_pool;
    Check(cache->num_layers() == pool.num_layers() && cache->spec() == pool.spec() &&
              cache->conv_dtype() == pool.conv_dtype(),
          "prefix cache: its layers, state shape or conv dtype differ from the state pool's");
    notes_.push_back(cache->enabled() ? "prefix cache: " + std::to_string(cache->capacity()) + " snapshots of " +
                                            std::to_string(cache->snapshot_bytes()) + " bytes, one every " +
                                            std::to_string(config_.snapshot_interval) + " tokens"
                                      : std::string("prefix cache: off (its budget holds no snapshot)"));
  }
}

void Scheduler::Submit(const ServeRequest& request) {
  Check(request.length >= 0 && request.decode_tokens >= 0,
        "request " + std::to_string(request.id) + ": negative length");
  Check(request.length == 0 || request.input.data != nullptr, "request " + std::to_string(request.id) + ": no input");
  Check(request.input.dtype == runner_.model().act_dtype || request.length == 0,
        "request " + std::to_string(request.id) + ": input dtype differs from the model's");
  Check(request.token_ids == nullptr || request.length > 0,
        "request " + std::to_string(request.id) + ": token ids without rows");
  Check(std::find(known_ids_.begin(), known_ids_.end(), request.id) == known_ids_.end(),
        "request " + std::to_string(request.id) + " was already submitted");
  known_ids_.push_back(request.id);
  waiting_.push_back(request);
}

void Scheduler::Admit() {
  RecurrentStatePool& pool = *pools_.state_pool;
  const DeltaRuleModel& model = runner_.model();
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running && pool.num_free() > 0) {
    Running r;
    r.req = waiting_.front();
    waiting_.pop_front();
    r.slot = pools_.req_to_token_pool->Alloc(r.req.id);
    running_.push_back(std::move(r));  // from here on the slot is released with the request
    Running& a = running_.back();
    const int32_t slot = a.slot;
    if (a.req.initial_recurrent != nullptr || a.req.initial_conv != nullptr) {
      pool.SetSlotState(slot, a.req.initial_recurrent, a.req.initial_conv);
      a.seeded = true;
    }
    a.result.id = a.req.id;
    if (a.req.token_ids != nullptr) a.result.token_ids.assign(a.req.token_ids, a.req.token_ids + a.req.length);
    a.result.out.assign(static_cast<size_t>(a.req.length * model.geometry.hidden) * DTypeSize(model.act_dtype), 0);
    // An initial state is not part of the key: such requests are never cached.
    a.cacheable = caching() && a.req.token_ids != nullptr && !a.seeded && a.req.length > 0;
    if (a.cacheable) Reuse(a, slot);
    if (a.done == a.req.length) Finish(running_.size() - 1);  // nothing to run: its state is final
  }
}

void Scheduler::Reuse(Running& r, int32_t slot) {
  RadixStateCache& cache = *config_.prefix_cache;
  RecurrentStatePool& pool = *pools_.state_pool;
  const std::optional<RadixStateCache::Snapshot> hit = cache.Match(r.result.token_ids.data(), r.req.length);
  if (!hit) return;
  try {
    // Copy-on-write: the slot gets a copy, the snapshot is never written.
    pool.SetSlotState(slot, hit->recurrent, hit->conv);
  } catch (...) {
    cache.Unlock(hit->id);
    throw;
  }
  cache.Unlock(hit->id);
  r.done = hit->length;
  r.seeded = true;
  r.result.cached_tokens = hit->length;
}

void Scheduler::SnapshotFromSlot(const Running& r, int32_t slot) {
  RadixStateCache& cache = *config_.prefix_cache;
  const RecurrentStatePool& pool = *pools_.state_pool;
  const std::optional<RadixStateCache::Snapshot> s = cache.Reserve(r.result.token_ids.data(), r.req.length);
  if (!s) return;
  pool.GetSlotState(slot, s->recurrent, s->conv);
  cache.Commit(s->id);
}

void Scheduler::Finish(size_t index) {
  Running& r = running_[index];
  RecurrentStatePool& pool = *pools_.state_pool;
  const int32_t slot = r.slot;
  r.result.final_recurrent.resize(static_cast<size_t>(pool.recurrent_elems_per_request()));
  r.result.final_conv.resize(static_cast<size_t>(pool.conv_bytes_per_request()));
  pool.GetSlotState(slot, r.result.final_recurrent.data(), r.result.final_conv.data());
  if (r.cacheable) SnapshotFromSlot(r, slot);  // the next turn of a conversation reuses the whole request
  cache_hit_tokens_ += r.result.cached_tokens;
  pools_.req_to_token_pool->Free(r.req.id);
  finished_.push_back(std::move(r.result));
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
}

void Scheduler::Drop(size_t index, const std::string& error) {
  Running& r = running_[index];
  if (pools_.req_to_token_pool->Has(r.req.id)) pools_.req_to_token_pool->Free(r.req.id);
  failed_.push_back({r.req.id, error});
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
}

Scheduler::~Scheduler() {
  for (const Running& r : running_) {
    if (pools_.req_to_token_pool->Has(r.req.id)) pools_.req_to_token_pool->Free(r.req.id);
  }
}

bool Scheduler::Cancel(int64_t id) {
  const auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const ServeRequest& r) { return r.id == id; });
  if (w != waiting_.end()) {
    waiting_.erase(w);
    failed_.push_back({id, "cancelled"});
    return true;
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    if (running_[i].req.id == id) {
      Drop(i, "cancelled");
      return true;
    }
  }
  return false;
}

bool Scheduler::Step() {
  Admit();
  if (running_.empty()) return false;
  const DeltaRuleModel& model = runner_.model();
  // Prefill first: every running request with prefill left gets a chunk while
  // the step budget lasts; otherwise one decode row for every request.
  StepPlan plan;
  PlanExtend(plan);
  if (plan.members.empty()) PlanDecode(plan);
  if (plan.batch.mode == ForwardMode::kExtend && caching()) ReserveSnapshots(plan);
  const std::vector<uint8_t> x = GatherInputs(plan);
  const int64_t T = plan.batch.num_tokens();
  ActBuffer out(model.act_dtype, T * model.geometry.hidden);
  const auto t0 = std::chrono::steady_clock::now();
  RunForward(plan, x, out.mut());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t kept = 0;
  for (int64_t n : plan.keep) kept += n;
  steps_.push_back({plan.batch.mode, static_cast<int64_t>(plan.members.size()), T, secs, kept});
  Deliver(plan, out.view());
  return true;
}

void Scheduler::PlanExtend(StepPlan& plan) const {
  int64_t budget = config_.step_token_budget;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const Running& r = running_[i];
    const int64_t left = r.prefill_len() - r.done;
    if (left <= 0) continue;
    int64_t n = std::min(left, budget);
    if (config_.prefill_chunk > 0) n = std::min(n, config_.prefill_chunk);
    if (r.cacheable) {
      // A snapshot point not 64-aligned from this step's start ends the step's segment instead.
      const int64_t q = (r.done / config_.snapshot_interval + 1) * config_.snapshot_interval;
      if (q <= r.done + n && (q - r.done) % kSnapshotAlign != 0) n = q - r.done;
    }
    plan.batch.mode = ForwardMode::kExtend;
    plan.members.push_back(i);
    plan.batch.extend_lens.push_back(n);
    budget -= n;
  }
}

void Scheduler::PlanDecode(StepPlan& plan) {
  plan.batch.mode = ForwardMode::kDecode;
  const int64_t max_draft = pools_.state_pool->verify().max_draft_tokens;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Running& r = running_[i];
    if (r.done >= r.req.length) continue;
    const int64_t max_k = std::min(max_draft, r.req.length - r.done - 1);
    const int64_t k = max_k > 0 && r.req.draft.propose ? ProposeDrafts(i, max_k, plan) : 0;
    if (k > 0) plan.batch.mode = ForwardMode::kTargetVerify;
    plan.members.push_back(i);
    plan.draft_counts.push_back(k);
    plan.batch.extend_lens.push_back(1 + k);
  }
}

int64_t Scheduler::ProposeDrafts(size_t index, int64_t max_k, StepPlan& plan) {
  const Running& r = running_[index];
  const DeltaRuleModel& model = runner_.model();
  const size_t row_bytes = static_cast<size_t>(model.geometry.hidden) * DTypeSize(model.act_dtype);
  const size_t at = plan.drafts.size(), at_id = plan.draft_ids.size();
  plan.drafts.resize(at + static_cast<size_t>(max_k) * row_bytes);
  plan.draft_ids.resize(at_id + static_cast<size_t>(max_k), -1);
  int64_t k = 0;
  try {
    k = r.req.draft.propose(r.done, max_k, plan.drafts.data() + at, plan.draft_ids.data() + at_id);
    Check(k >= 0 && k <= max_k, "proposed " + std::to_string(k) + " drafts, expected 0.." + std::to_string(max_k));
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = plan.draft_ids[at_id + static_cast<size_t>(j)];
      Check(id >= -1, [&] { return "draft " + std::to_string(j) + ": token id " + std::to_string(id); });
    }
  } catch (const std::exception& e) {
    const std::string error = "request " + std::to_string(r.req.id) + ": draft source: " + e.what();
    Drop(index, error);
    throw Error(error);
  }
  plan.drafts.resize(at + static_cast<size_t>(k) * row_bytes);
  plan.draft_ids.resize(at_id + static_cast<size_t>(k));
  return k;
}

void Scheduler::ReserveSnapshots(StepPlan& plan) {
  ForwardBatch& batch = plan.batch;
  RadixStateCache& cache = *config_.prefix_cache;
  batch.snapshot_cu.assign(1, 0);
  for (size_t m = 0; m < plan.members.size(); ++m) {
    const Running& r = running_[plan.members[m]];
    const int64_t n = batch.extend_lens[m];
    if (r.cacheable) {
      std::vector<int64_t> offsets;
      for (int64_t q = (r.done / config_.snapshot_interval + 1) * config_.snapshot_interval; q <= r.done + n;
           q += config_.snapshot_interval) {
        offsets.push_back(q - r.done);
      }
      if (r.done + n == r.prefill_len() && (offsets.empty() || offsets.back() != n)) offsets.push_back(n);
      for (int64_t off : offsets) {
        // Locked until committed after the forward (or abandoned with the step).
        std::optional<RadixStateCache::Snapshot> s;
        try {
          s = cache.Reserve(r.result.token_ids.data(), r.done + off);
        } catch (...) {
          for (int32_t id : plan.reserved) cache.Abandon(id);
          throw;
        }
        if (!s) continue;
        plan.reserved.push_back(s->id);
        batch.snapshot_offsets.push_back(off);
        batch.snapshot_recurrent.push_back(s->recurrent);
        batch.snapshot_conv.push_back(s->conv);
      }
    }
    batch.snapshot_cu.push_back(static_cast<int64_t>(batch.snapshot_offsets.size()));
  }
  if (plan.reserved.empty()) batch.snapshot_cu.clear();
}

std::vector<uint8_t> Scheduler::GatherInputs(StepPlan& plan) const {
  const DeltaRuleModel& model = runner_.model();
  const size_t row_bytes = static_cast<size_t>(model.geometry.hidden) * DTypeSize(model.act_dtype);
  const bool verify = plan.batch.mode == ForwardMode::kTargetVerify;
  ForwardBatch& batch = plan.batch;
  std::vector<uint8_t> x;
  size_t draft_at = 0;
  for (size_t m = 0; m < plan.members.size(); ++m) {
    const Running& r = running_[plan.members[m]];
    batch.req_ids.push_back(r.req.id);
    batch.req_pool_indices.push_back(r.slot);
    batch.prefix_lens.push_back(r.done);
    batch.state_seeded.push_back(r.seeded ? 1 : 0);
    const auto* src = static_cast<const uint8_t*>(r.req.input.data) + static_cast<size_t>(r.done) * row_bytes;
    const int64_t own = verify ? 1 : batch.extend_lens[m];
    x.insert(x.end(), src, src + static_cast<size_t>(own) * row_bytes);
    if (verify) {
      const size_t n = static_cast<size_t>(plan.draft_counts[m]) * row_bytes;
      x.insert(x.end(), plan.drafts.begin() + static_cast<std::ptrdiff_t>(draft_at),
               plan.drafts.begin() + static_cast<std::ptrdiff_t>(draft_at + n));
      draft_at += n;
    }
  }
  return x;
}

void Scheduler::RunForward(StepPlan& plan, const std::vector<uint8_t>& x, MutBuf out) {
  const DeltaRuleModel& model = runner_.model();
  const size_t row_bytes = static_cast<size_t>(model.geometry.hidden) * DTypeSize(model.act_dtype);
  plan.keep = plan.batch.extend_lens;
  try {
    runner_.Forward(plan.batch, {x.data(), model.act_dtype}, out);
    if (plan.batch.mode == ForwardMode::kTargetVerify) {
      int64_t at = 0;
      for (size_t m = 0; m < plan.members.size(); ++m) {
        const Running& r = running_[plan.members[m]];
        const int64_t k = plan.draft_counts[m];
        int64_t a = k;
        if (k > 0 && r.req.draft.accept) {
          a = r.req.draft.accept(r.done, k, static_cast<const uint8_t*>(out.data) + at * row_bytes);
          Check(a >= 0 && a <= k, [&] {
            return "request " + std::to_string(r.req.id) + ": accepted " + std::to_string(a) + " of " +
                   std::to_string(k) + " drafts";
          });
        }
        plan.keep[m] = a + 1;
        at += 1 + k;
      }
      runner_.CommitVerify(plan.batch.req_ids, plan.keep);
    }
  } catch (const std::exception& e) {
    // The step's states are half-updated: its requests fail, their slots go
    // back to the pool, its snapshots are dropped.
    for (int32_t id : plan.reserved) config_.prefix_cache->Abandon(id);
    for (size_t m = plan.members.size(); m-- > 0;) Drop(plan.members[m], e.what());
    throw;
  }
  for (int32_t id : plan.reserved) config_.prefix_cache->Commit(id);
}

void Scheduler::Deliver(const StepPlan& plan, ConstBuf out) {
  const DeltaRuleModel& model = runner_.model();
  const size_t row_bytes = static_cast<size_t>(model.geometry.hidden) * DTypeSize(model.act_dtype);
  const bool verify = plan.batch.mode == ForwardMode::kTargetVerify;
  int64_t row = 0;
  size_t id_at = 0;
  for (size_t m = 0; m < plan.members.size(); ++m) {
    Running& r = running_[plan.members[m]];
    const int64_t n = plan.keep[m];
    std::memcpy(r.result.out.data() + static_cast<size_t>(r.done) * row_bytes,
                static_cast<const uint8_t*>(out.data) + static_cast<size_t>(row) * row_bytes,
                static_cast<size_t>(n) * row_bytes);
    if (verify) {
      // The accepted drafts' ids in their places (the prefix cache's key).
      if (!r.result.token_ids.empty()) {
        for (int64_t j = 0; j + 1 < n; ++j) {
          const int32_t id = plan.draft_ids[id_at + static_cast<size_t>(j)];
          if (id >= 0) r.result.token_ids[static_cast<size_t>(r.done + 1 + j)] = id;
        }
      }
      id_at += static_cast<size_t>(plan.draft_counts[m]);
    }
    r.done += n;
    row += plan.batch.extend_lens[m];
  }
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i].done == running_[i].req.length) Finish(i);
  }
}

void Scheduler::RunToCompletion() {
  while (Step()) {
  }
  Check(waiting_.empty() && running_.empty(),
        "scheduler: " + std::to_string(waiting_.size()) + " requests wait for a state slot, but all " +
            std::to_string(pools_.state_pool->capacity()) + " slots of the pool are held outside this scheduler");
}

}  // namespace kda
