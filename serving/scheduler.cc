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

std::vector<std::string> CheckServerArgs(SchedulerConfig& config) {
  std::vector<std::string> notes;
  Check(!config.enable_mixed_chunk,
        "mixed chunk (prefill and decode segments in one EXTEND batch) is not supported for KDA models");
  if (config.enable_radix_cache) {
    notes.emplace_back(
        "radix (prefix) cache disabled: KDA layers are recurrent and have no KV prefix reuse (recurrent prefix "
        "caching: a RadixStateCache, --prefix-cache-mib)");
    config.enable_radix_cache = false;
  }
  Check(config.snapshot_interval >= kSnapshotAlign && config.snapshot_interval % kSnapshotAlign == 0,
        "snapshot_interval must be a positive multiple of " + std::to_string(kSnapshotAlign) + ", got " +
            std::to_string(config.snapshot_interval));
  Check(config.max_running >= 0, "max_running must be >= 0");
  Check(config.prefill_chunk >= 0, "prefill_chunk must be >= 0");
  Check(config.step_token_budget >= 1, "step_token_budget must be >= 1");
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
  const int64_t hidden = model.geometry.hidden;
  const size_t row_bytes = static_cast<size_t>(hidden) * DTypeSize(model.act_dtype);

  // Prefill first: every running request with prefill left gets a chunk while
  // the step budget lasts; otherwise one decode token for every request.
  ForwardBatch batch;
  std::vector<size_t> members;
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
    batch.mode = ForwardMode::kExtend;
    members.push_back(i);
    batch.extend_lens.push_back(n);
    budget -= n;
  }
  // Decode: one row per request, plus the drafts its draft source proposes
  // (a TARGET_VERIFY step when any request has some).
  std::vector<uint8_t> drafts;        // the members' draft rows, in order
  std::vector<int32_t> draft_ids;     // their token ids (-1: the request's own)
  std::vector<int64_t> draft_counts;  // [members] k
  if (members.empty()) {
    batch.mode = ForwardMode::kDecode;
    const int64_t max_draft = pools_.state_pool->verify().max_draft_tokens;
    for (size_t i = 0; i < running_.size(); ++i) {
      const Running& r = running_[i];
      if (r.done >= r.req.length) continue;
      int64_t k = 0;
      const int64_t max_k = std::min(max_draft, r.req.length - r.done - 1);
      if (max_k > 0 && r.req.draft.propose) {
        const size_t at = drafts.size(), at_id = draft_ids.size();
        drafts.resize(at + static_cast<size_t>(max_k) * row_bytes);
        draft_ids.resize(at_id + static_cast<size_t>(max_k), -1);
        try {
          k = r.req.draft.propose(r.done, max_k, drafts.data() + at, draft_ids.data() + at_id);
          Check(k >= 0 && k <= max_k,
                "proposed " + std::to_string(k) + " drafts, expected 0.." + std::to_string(max_k));
          for (int64_t j = 0; j < k; ++j) {
            const int32_t id = draft_ids[at_id + static_cast<size_t>(j)];
            Check(id >= -1, [&] { return "draft " + std::to_string(j) + ": token id " + std::to_string(id); });
          }
        } catch (const std::exception& e) {
          const std::string error = "request " + std::to_string(r.req.id) + ": draft source: " + e.what();
          Drop(i, error);
          throw Error(error);
        }
        drafts.resize(at + static_cast<size_t>(k) * row_bytes);
        draft_ids.resize(at_id + static_cast<size_t>(k));
      }
      if (k > 0) batch.mode = ForwardMode::kTargetVerify;
      members.push_back(i);
      draft_counts.push_back(k);
      batch.extend_lens.push_back(1 + k);
    }
  }
  // Snapshots of the step (EXTEND): every interval point inside a segment and the end of each prompt, reserved
  // in the cache now (locked until committed after the forward).
  std::vector<int32_t> reserved;
  if (batch.mode == ForwardMode::kExtend && caching()) {
    batch.snapshot_cu.assign(1, 0);
    for (size_t m = 0; m < members.size(); ++m) {
      const Running& r = running_[members[m]];
      const int64_t n = batch.extend_lens[m];
      if (r.cacheable) {
        std::vector<int64_t> offsets;
        for (int64_t q = (r.done / config_.snapshot_interval + 1) * config_.snapshot_interval; q <= r.done + n;
             q += config_.snapshot_interval) {
          offsets.push_back(q - r.done);
        }
        if (r.done + n == r.prefill_len() && (offsets.empty() || offsets.back() != n)) offsets.push_back(n);
        for (int64_t off : offsets) {
          std::optional<RadixStateCache::Snapshot> s;
          try {
            s = config_.prefix_cache->Reserve(r.result.token_ids.data(), r.done + off);
          } catch (...) {
            for (int32_t id : reserved) config_.prefix_cache->Abandon(id);
            throw;
          }
          if (!s) continue;
          reserved.push_back(s->id);
          batch.snapshot_offsets.push_back(off);
          batch.snapshot_recurrent.push_back(s->recurrent);
          batch.snapshot_conv.push_back(s->conv);
        }
      }
      batch.snapshot_cu.push_back(static_cast<int64_t>(batch.snapshot_offsets.size()));
    }
    if (reserved.empty()) batch.snapshot_cu.clear();
  }
  const bool verify = batch.mode == ForwardMode::kTargetVerify;
  std::vector<uint8_t> x;
  size_t draft_at = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    const Running& r = running_[members[m]];
    batch.req_ids.push_back(r.req.id);
    batch.req_pool_indices.push_back(r.slot);
    batch.prefix_lens.push_back(r.done);
    batch.state_seeded.push_back(r.seeded ? 1 : 0);
    const auto* src = static_cast<const uint8_t*>(r.req.input.data) + static_cast<size_t>(r.done) * row_bytes;
    const int64_t own = verify ? 1 : batch.extend_lens[m];  // a verify step: the next row, then the drafts
    x.insert(x.end(), src, src + static_cast<size_t>(own) * row_bytes);
    if (verify) {
      const size_t n = static_cast<size_t>(draft_counts[m]) * row_bytes;
      x.insert(x.end(), drafts.begin() + static_cast<std::ptrdiff_t>(draft_at),
               drafts.begin() + static_cast<std::ptrdiff_t>(draft_at + n));
      draft_at += n;
    }
  }
  const int64_t T = batch.num_tokens();
  ActBuffer out(model.act_dtype, T * hidden);
  std::vector<int64_t> keep = batch.extend_lens;  // rows each member keeps
  const auto t0 = std::chrono::steady_clock::now();
  try {
    runner_.Forward(batch, {x.data(), model.act_dtype}, out.mut());
    if (verify) {
      int64_t at = 0;
      for (size_t m = 0; m < members.size(); ++m) {
        const Running& r = running_[members[m]];
        const int64_t k = draft_counts[m];
        int64_t a = k;
        if (k > 0 && r.req.draft.accept) {
          a = r.req.draft.accept(r.done, k, static_cast<const uint8_t*>(out.data()) + at * row_bytes);
          Check(a >= 0 && a <= k, [&] {
            return "request " + std::to_string(r.req.id) + ": accepted " + std::to_string(a) + " of " +
                   std::to_string(k) + " drafts";
          });
        }
        keep[m] = a + 1;
        at += 1 + k;
      }
      runner_.CommitVerify(batch.req_ids, keep);
    }
  } catch (const std::exception& e) {
    // The step's states are half-updated: its requests fail, their slots go
    // back to the pool, its snapshots are dropped.
    for (int32_t id : reserved) config_.prefix_cache->Abandon(id);
    for (size_t m = members.size(); m-- > 0;) Drop(members[m], e.what());
    throw;
  }
  for (int32_t id : reserved) config_.prefix_cache->Commit(id);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t kept = 0;
  for (int64_t n : keep) kept += n;
  steps_.push_back({batch.mode, static_cast<int64_t>(members.size()), T, secs, kept});

  // Outputs (and ids) of the kept positions back to their requests; finished requests release their slots.
  int64_t row = 0;
  size_t id_at = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    Running& r = running_[members[m]];
    const int64_t n = keep[m];
    std::memcpy(r.result.out.data() + static_cast<size_t>(r.done) * row_bytes,
                static_cast<const uint8_t*>(out.data()) + static_cast<size_t>(row) * row_bytes,
                static_cast<size_t>(n) * row_bytes);
    if (verify) {
      if (!r.result.token_ids.empty()) {
        for (int64_t j = 0; j + 1 < n; ++j) {
          const int32_t id = draft_ids[id_at + static_cast<size_t>(j)];
          if (id >= 0) r.result.token_ids[static_cast<size_t>(r.done + 1 + j)] = id;
        }
      }
      id_at += static_cast<size_t>(draft_counts[m]);
    }
    r.done += n;
    row += batch.extend_lens[m];
  }
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i].done == running_[i].req.length) Finish(i);
  }
  return true;
}

void Scheduler::RunToCompletion() {
  while (Step()) {
  }
  Check(waiting_.empty() && running_.empty(),
        "scheduler: " + std::to_string(waiting_.size()) + " requests wait for a state slot, but all " +
            std::to_string(pools_.state_pool->capacity()) + " slots of the pool are held outside this scheduler");
}

}  // namespace kda
