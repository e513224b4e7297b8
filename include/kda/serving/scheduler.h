// A serving loop for KDA layers: requests are admitted while state slots are
// free (the rest queue), prefills go in chunks under a per-step token budget
// (continuations are EXTEND steps with has_initial_state), decodes are batched
// one token per running request, and slots are freed as requests finish.
//
// Speculative decoding (docs/speculative.md): on a pool with a verify area
// (VerifyConfig), a decode step in which some request's draft source proposes
// drafts is a TARGET_VERIFY step instead (requests without drafts take part
// with k = 0), followed in the same step by the commit of each request's
// accepted positions. An EXTEND never shares a step with a verify.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kda/layers/forward_batch.h"
#include "kda/mem_cache/memory_pools.h"
#include "kda/mem_cache/radix_state_cache.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/serving/model_runner.h"

namespace kda {

struct SchedulerConfig {
  int64_t max_running = 0;           // requests holding a slot at once (0: the pool's capacity)
  int64_t prefill_chunk = 0;         // max tokens of one request per EXTEND step (0: no limit)
  int64_t step_token_budget = 4096;  // max tokens per EXTEND step
  bool enable_mixed_chunk = false;   // refused for KDA models
  bool enable_radix_cache = false;   // sglang's KV radix cache flag: reported disabled (see prefix_cache)
  // Recurrent prefix caching (null or a zero budget: off). Not owned; made for
  // the runner's model and pool shape. Requests with token ids start from the
  // deepest snapshot of their prefix; snapshots are taken inside prefills at
  // every multiple of snapshot_interval tokens (a multiple of 64), at the end
  // of each prompt and at the end of each finished request.
  RadixStateCache* prefix_cache = nullptr;
  int64_t snapshot_interval = 256;
};

// How a rule names an option: as the structs' fields and Python's keywords
// (max_running) or as the CLI's flags (--max-running; the CLI takes the byte
// budgets in MiB: --state-budget-mib, --prefix-cache-mib).
enum class OptionNames : uint8_t { kFields, kFlags };
std::string OptionName(const char* field, OptionNames names);

// kda::Error naming the first field that breaks its rule: max_running >= 0,
// prefill_chunk >= 0, step_token_budget >= 1, snapshot_interval a positive
// multiple of kSnapshotAlign.
void ValidateSchedulerConfig(const SchedulerConfig& config, OptionNames names = OptionNames::kFields);

// Server-argument checks for a model with recurrent (KDA) layers: the rules
// above; mixed chunk is refused (kda::Error); the KV radix cache is turned
// off (recurrent prefixes are cached by prefix_cache instead). Returns the
// messages to report (e.g. the radix cache being disabled).
std::vector<std::string> CheckServerArgs(SchedulerConfig& config);

// A request's drafts for speculative decoding. At each of the request's
// decode steps (once `committed` of its rows are committed) the scheduler asks
// `propose` for up to max_k draft rows, verifies the request's next row and
// the drafts in one TARGET_VERIFY step, asks `accept` how many drafts were
// accepted and keeps the next row plus that many: its result and state then
// extend by exactly those positions, and its next step starts at row
// committed + a + 1. Accepted drafts stand for the request's next rows (in an
// engine they are the tokens the target model chose); the results are those
// of the rows verified, and the committed token ids (RequestResult::token_ids,
// the prefix cache's key) are the accepted drafts' ids. max_k never reaches
// past the request's last row. With tensor parallelism every rank of a
// data-parallel index calls both with the same arguments and must get the
// same answers.
struct DraftSource {
  // Writes k <= max_k draft rows [k, hidden] (activation dtype) to `rows` and
  // their token ids [k] to `ids`, and returns k (0: no drafts this step). An id
  // left at -1 stands for the request's own id at that position.
  std::function<int64_t(int64_t committed, int64_t max_k, void* rows, int32_t* ids)> propose;
  // a in [0, k]: the accepted drafts, a prefix of them. `out` [1 + k, hidden]
  // (activation dtype): the verify step's outputs of the request's positions.
  // Null: every draft is accepted.
  std::function<int64_t(int64_t committed, int64_t k, const void* out)> accept;
};

// One request: `length` input rows; the last `decode_tokens` of them (when
// length > decode_tokens) are fed as DECODE steps after the prefill (or
// verified with drafts, see DraftSource).
struct ServeRequest {
  int64_t id = 0;
  ConstBuf input;  // [length, hidden] in the model's activation dtype; must outlive the scheduler's run
  int64_t length = 0;
  int64_t decode_tokens = 0;
  // Optional initial state per layer: [L, H, K, V] fp32 and [L, W-1, 3P] in the
  // activation dtype (null: start from zero).
  const float* initial_recurrent = nullptr;
  const void* initial_conv = nullptr;
  // Optional token ids [length] (prefix caching: the key of the cache; they
  // must determine the input rows). Without them, or with an initial state,
  // a request is never cached.
  const int32_t* token_ids = nullptr;
  // Optional drafts for its decode rows (empty propose: none); used when the
  // runner's pool has a verify area.
  DraftSource draft{};
};

struct RequestResult {
  int64_t id = 0;
  // [length, hidden] in the activation dtype, the last layer's output. Rows
  // [0, cached_tokens) were reused from the prefix cache, not computed: zeros.
  std::vector<uint8_t> out;
  int64_t cached_tokens = 0;
  // [length] with ServeRequest::token_ids (else empty): the ids of the rows
  // committed, the request's own with accepted drafts' ids in their places.
  std::vector<int32_t> token_ids;
  std::vector<float> final_recurrent;  // [L, H, K, V]
  std::vector<uint8_t> final_conv;     // [L, W-1, 3P] in the activation dtype
};

// A request that ended without a result: cancelled, or in a step whose
// forward failed. Its slot was freed.
struct FailedRequest {
  int64_t id = 0;
  std::string error;
};

struct StepRecord {
  ForwardMode mode = ForwardMode::kIdle;
  int64_t batch_size = 0;  // requests in the step
  int64_t tokens = 0;
  double seconds = 0.0;
  int64_t kept = 0;  // TARGET_VERIFY: positions kept by the commit (committed tokens); else = tokens
};

class Scheduler {
 public:
  // Serves through `runner`, on its pools. Applies CheckServerArgs to `config`.
  Scheduler(ModelRunner& runner, const SchedulerConfig& config);

  // Frees the slots of the requests still running: the pool outlives a
  // scheduler that stopped on an error with nothing leaked.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (kda::Error on a bad or duplicate request).
  void Submit(const ServeRequest& request);
  // Runs one forward step; false when nothing was left to run. When the
  // forward throws, the step's requests fail (their slots freed, their ids in
  // failed()) and the error propagates; the other requests can go on.
  bool Step();
  // Steps until every submitted request has finished or failed. kda::Error
  // when requests wait but no slot can ever be had (the pool's slots are all
  // held outside this scheduler).
  void RunToCompletion();
  // Ends a waiting or running request without a result (its slot freed, its
  // id in failed()); false when it is neither.
  bool Cancel(int64_t id);

  // Results in the order requests finished.
  const std::vector<RequestResult>& finished() const { return finished_; }
  const std::vector<FailedRequest>& failed() const { return failed_; }
  // Hands over the finished and failed requests so far (a long-running
  // server drains them; finished() and failed() are empty afterwards).
  std::vector<RequestResult> TakeFinished() { return std::exchange(finished_, {}); }
  std::vector<FailedRequest> TakeFailed() { return std::exchange(failed_, {}); }
  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::vector<std::string>& notes() const { return notes_; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Rows of the finished requests reused from the prefix cache, in total.
  int64_t cache_hit_tokens() const { return cache_hit_tokens_; }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }

 private:
  struct Running {
    ServeRequest req;
    int32_t slot = -1;  // its state slot, resolved once at admission
    int64_t done = 0;   // tokens processed
    bool seeded = false;
    bool cacheable = false;  // token ids, no initial state, the cache on
    RequestResult result;    // result.token_ids: the committed ids so far, then the request's (the cache's key)
    // Tokens fed as EXTEND; the rest go as DECODE steps.
    int64_t prefill_len() const { return req.length > req.decode_tokens ? req.length - req.decode_tokens : req.length; }
  };
  // One step, planned then run: its batch, the running requests in it
  // (indices into running_, in batch order) and, for a verify step, their drafts.
  struct StepPlan {
    ForwardBatch batch;
    std::vector<size_t> members;
    std::vector<uint8_t> drafts;        // the members' draft rows, in order
    std::vector<int32_t> draft_ids;     // their token ids (-1: the request's own)
    std::vector<int64_t> draft_counts;  // [members] k
    std::vector<int32_t> reserved;      // snapshots reserved in the prefix cache, committed after the forward
    std::vector<int64_t> keep;          // [members] rows each keeps (a verify: 1 + the accepted drafts)
  };
  void Admit();
  // Prefill chunks for the requests with prefill left, while the step budget lasts.
  void PlanExtend(StepPlan& plan) const;
  // One row per request plus the drafts its source proposes (TARGET_VERIFY when any has some).
  void PlanDecode(StepPlan& plan);
  // Up to max_k drafts of running_[index] appended to the plan; returns k. A source that fails drops the request.
  int64_t ProposeDrafts(size_t index, int64_t max_k, StepPlan& plan);
  // The step's snapshots (EXTEND with the cache on): every interval point inside a segment and each prompt's end.
  void ReserveSnapshots(StepPlan& plan);
  // The batch's per-request fields and its input rows (a verify: each request's next row, then its drafts).
  std::vector<uint8_t> GatherInputs(StepPlan& plan) const;
  // The forward and, for a verify, the acceptance and commit; on an error the step's requests fail.
  void RunForward(StepPlan& plan, const std::vector<uint8_t>& x, MutBuf out);
  // The kept rows (and draft ids) back to their requests; finished requests release their slots.
  void Deliver(const StepPlan& plan, ConstBuf out);
  void Finish(size_t index);
  void Drop(size_t index, const std::string& error);  // running_[index] fails
  bool caching() const { return config_.prefix_cache != nullptr && config_.prefix_cache->enabled(); }
  // Copies the deepest snapshot of the request's prefix into its slot.
  void Reuse(Running& r, int32_t slot);
  // Snapshot of the request's whole length from its slot (end of the request).
  void SnapshotFromSlot(const Running& r, int32_t slot);

  ModelRunner& runner_;
  MemoryPools pools_;
  SchedulerConfig config_;
  std::vector<std::string> notes_;
  std::deque<ServeRequest> waiting_;
  std::vector<Running> running_;
  std::vector<RequestResult> finished_;
  std::vector<FailedRequest> failed_;
  std::vector<StepRecord> steps_;
  std::vector<int64_t> known_ids_;
  int64_t cache_hit_tokens_ = 0;
};

}  // namespace kda
