// Host side of the optimized KDA kernels: validation, the split into tasks,
// per-worker scratch and the parallel loop. The compute code is in
// chunk_kda_simd.cc and fused_recurrent_kda_simd.cc, compiled per instruction set and
// reached through the dispatch table (kernels/isa/dispatch.h).
//
// Threads: a prefill task is a group of up to kc::kHeadGroup heads of one
// sequence (advanced in lockstep, see kernels/kda/kda_tasks.h) when there are enough
// (sequence, head) pairs for about four tasks per worker; with fewer pairs
// (N = 1 with few heads) a task is one head's group of value columns (the
// columns of the recurrence are independent). Longer sequences are scheduled
// first. Results do not depend on the split. Recurrent tasks are (sequence,
// value head), a contiguous range per worker.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/parallel.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_optimized.h"
#include "kda/kernels/kernel_isa.h"
#include "kernels/isa/constants.h"
#include "kernels/isa/dispatch.h"
#include "kernels/kda/kda_common.h"
#include "kernels/kda/kda_tasks.h"

namespace kda {
namespace {

constexpr size_t kAlignFloats = 16;  // 64 bytes

// Rounds n floats up to whole 64-byte lines.
size_t Padded(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Scratch of one chunk worker (see internal::ChunkScratch), 64-byte aligned.
class ChunkWorker {
 public:
  ChunkWorker(int k_dim, int v_dim) {
    const auto kd = static_cast<size_t>(k_dim);
    const auto vd = static_cast<size_t>(v_dim);
    const auto tb = static_cast<size_t>(kc::kTokenBlock);
    // state, c, c_end, proj, then per prepared block: khat, qhat, kpre, kq, mfac, vrow, beta, gamma.
    const size_t prep_sizes[] = {tb * kd, tb * kd, tb * kd, tb * kd, tb * kd, tb * vd, tb, tb};
    size_t total = kAlignFloats + Padded(kd * vd) + 2 * Padded(kd) + Padded(2 * vd);
    for (size_t n : prep_sizes) total += 2 * Padded(n);
    // Uninitialised: every element is written before it is read.
    storage_ = std::make_unique_for_overwrite<float[]>(total);
    mat_ = std::make_unique_for_overwrite<uint32_t[]>(2 * tb);
    lines_ = std::make_unique_for_overwrite<const void*[]>(tb * kc::kMaxLinesPerToken);
    scratch_.lines = lines_.get();
    const auto address = reinterpret_cast<uintptr_t>(storage_.get());
    float* next = storage_.get() + ((64 - address % 64) % 64) / sizeof(float);
    auto take = [&next](size_t n) {
      float* p = next;
      next += Padded(n);
      return p;
    };
    scratch_.state = take(kd * vd);
    scratch_.c = take(kd);
    scratch_.c_end = take(kd);
    scratch_.proj = take(2 * vd);
    for (int b = 0; b < 2; ++b) {
      internal::PrepBuffers& p = scratch_.prep[b];
      float** targets[] = {&p.khat, &p.qhat, &p.kpre, &p.kq, &p.mfac, &p.vrow, &p.beta, &p.gamma};
      static_assert(std::size(targets) == std::size(prep_sizes), "one size per prepared vector");
      for (size_t i = 0; i < std::size(targets); ++i) *targets[i] = take(prep_sizes[i]);
      p.mat = mat_.get() + static_cast<size_t>(b) * tb;
    }
  }
  const internal::ChunkScratch& scratch() const { return scratch_; }

 private:
  std::unique_ptr<float[]> storage_;
  std::unique_ptr<uint32_t[]> mat_;
  std::unique_ptr<const void*[]> lines_;
  internal::ChunkScratch scratch_;
};

// Scratch of one chunked SSD worker (see internal::SsdScratch) for heads of K', V' (padded), `heads` working
// states, 64-byte aligned.
class SsdWorker {
 public:
  SsdWorker(int k_dim, int v_dim, int heads) {
    const auto kd = static_cast<size_t>(k_dim);
    const auto vd = static_cast<size_t>(v_dim);
    const auto span = static_cast<size_t>(kc::kSsdSpan);
    const auto chunk = static_cast<size_t>(kc::kSsdChunk);
    internal::SsdScratch& s = scratch_;
    float** targets[] = {&s.q,    &s.k,     &s.qk,      &s.m,      &s.v,      &s.vw,  &s.g,
                         &s.beta, &s.decay, &s.readout, &s.update, &s.states, &s.ones};
    const size_t sizes[] = {span * kd,  span * kd,  span * chunk, chunk * chunk,
                            chunk * vd, chunk * vd, chunk,        chunk,
                            chunk,      chunk,      chunk,        static_cast<size_t>(heads) * kd * vd,
                            kd};
    static_assert(std::size(targets) == std::size(sizes), "one size per scratch vector");
    size_t total = kAlignFloats;
    for (size_t n : sizes) total += Padded(n);
    // Uninitialised: every element is written before it is read.
    storage_ = std::make_unique_for_overwrite<float[]>(total);
    const auto address = reinterpret_cast<uintptr_t>(storage_.get());
    float* next = storage_.get() + ((64 - address % 64) % 64) / sizeof(float);
    for (size_t i = 0; i < std::size(targets); ++i) {
      *targets[i] = next;
      next += Padded(sizes[i]);
    }
  }
  const internal::SsdScratch& scratch() const { return scratch_; }

 private:
  std::unique_ptr<float[]> storage_;
  internal::SsdScratch scratch_;
};

// Mamba2's SSD (a scalar gate, no delta correction) in chunked form over the non-empty sequences `busy` (longest
// first): a task is a range of the value heads of one key head of one sequence, as many heads as give about four
// tasks per worker (at most kc::kSsdMaxHeads).
void ChunkSsdTasks(const ChunkKdaArgs& a, const internal::KernelTable& kernels, const std::vector<int64_t>& busy,
                   float scale) {
  const int kp = internal::PaddedKeyDim(a.K, kernels.lanes);
  const int vp = internal::PaddedValueDim(a.V, kernels.lanes);
  const int threads = std::max(1, NumThreads());
  const int per_key_head = a.HV / a.H;
  const auto pairs = static_cast<int64_t>(busy.size()) * a.HV;
  const int want = std::min(per_key_head, kc::kSsdMaxHeads);
  const int heads = static_cast<int>(std::clamp<int64_t>(pairs / (4 * int64_t{threads}), 1, want));
  const int ranges = (per_key_head + heads - 1) / heads;  // per key head
  const int64_t tasks_per_sequence = int64_t{a.H} * ranges;
  const auto num_tasks = static_cast<int64_t>(busy.size()) * tasks_per_sequence;
  const int64_t num_workers = std::min<int64_t>(threads, num_tasks);
  std::vector<SsdWorker> workers;
  workers.reserve(static_cast<size_t>(num_workers));
  for (int64_t i = 0; i < num_workers; ++i) workers.emplace_back(kp, vp, heads);
  std::atomic<int64_t> next_task{0};
  ParallelFor(num_workers, [&](int64_t worker) {
    internal::SsdTask task;
    task.args = &a;
    task.scale = scale;
    task.scratch = workers[static_cast<size_t>(worker)].scratch();
    for (int64_t i = next_task.fetch_add(1); i < num_tasks; i = next_task.fetch_add(1)) {
      const int64_t n = busy[static_cast<size_t>(i / tasks_per_sequence)];
      const auto key_head = static_cast<int>(i % tasks_per_sequence / ranges);
      const auto r = static_cast<int>(i % ranges);
      const int first = per_key_head * r / ranges;
      task.n = n;
      task.h = key_head * per_key_head + first;
      task.heads = per_key_head * (r + 1) / ranges - first;
      task.initial = internal::SequenceInitialState(a, n);
      task.final = internal::SequenceFinalState(a, n);
      kernels.ssd_task(task);
    }
  });
}

}  // namespace

namespace internal {

void ChunkKdaOptimizedUnchecked(const ChunkKdaArgs& a, KernelIsa isa) {
  if (a.intermediate_states.data != nullptr) {
    RunWithIntermediateStates(a, [isa](const ChunkKdaArgs& b) { ChunkKdaOptimizedUnchecked(b, isa); });
    return;
  }
  const KernelTable& kernels = KernelsFor(isa);
  const float scale = EffectiveScale(a.options, a.K);
  const size_t state_size = static_cast<size_t>(a.K) * static_cast<size_t>(a.V);
  const size_t head_states = static_cast<size_t>(a.HV) * state_size;
  // The kernels work on head dims zero-padded to whole registers (kda_tasks.h).
  const int kp = PaddedKeyDim(a.K, kernels.lanes);
  const int vp = PaddedValueDim(a.V, kernels.lanes);

  // Padding sequences: zero outputs, no state touched. Empty sequences: the final state is the initial state
  // (zeros for none); nothing to write when aliased.
  std::vector<int64_t> busy;
  for (int64_t n = 0; n < a.N; ++n) {
    const int64_t len = a.cu_seqlens[n + 1] - a.cu_seqlens[n];
    if (IsPaddingSequence(a, n)) {
      if (len == 0) continue;
      const size_t row_bytes = static_cast<size_t>(a.HV) * static_cast<size_t>(a.V) * DTypeSize(a.o.dtype);
      // All-zero bits are 0.0 in F32, BF16 and F16 alike.
      std::memset(static_cast<char*>(a.o.data) + static_cast<size_t>(a.cu_seqlens[n]) * row_bytes, 0,
                  static_cast<size_t>(len) * row_bytes);
      continue;
    }
    if (len > 0) {
      busy.push_back(n);
      continue;
    }
    const float* initial = SequenceInitialState(a, n);
    float* final_state = SequenceFinalState(a, n);
    if (final_state == nullptr || final_state == initial) continue;
    if (initial != nullptr) {
      std::copy_n(initial, head_states, final_state);
    } else {
      std::fill_n(final_state, head_states, 0.0F);
    }
  }
  if (busy.empty()) return;
  // Longest sequences first, so that the dynamic schedule ends balanced.
  std::stable_sort(busy.begin(), busy.end(), [&](int64_t x, int64_t y) {
    return a.cu_seqlens[x + 1] - a.cu_seqlens[x] > a.cu_seqlens[y + 1] - a.cu_seqlens[y];
  });

  if (a.scalar_gate && !a.options.delta_correction && kernels.ssd_task != nullptr) {
    ChunkSsdTasks(a, kernels, busy, scale);
    return;
  }
  // Heads in lockstep groups when there are enough tasks for about four per worker; with fewer (sequence, head)
  // pairs, single heads split into value-column groups instead.
  const int threads = std::max(1, NumThreads());
  const int blocks = (vp + kernels.column_block - 1) / kernels.column_block;
  const auto pairs = static_cast<int64_t>(busy.size()) * a.HV;
  const int want = 4 * threads;
  const int head_group = static_cast<int>(std::clamp<int64_t>(pairs / std::max<int64_t>(want, 1), 1, kc::kHeadGroup));
  const int col_groups =
      head_group > 1 ? 1 : static_cast<int>(std::clamp<int64_t>((want + pairs - 1) / pairs, 1, blocks));
  // The tasks, numbered sequence by sequence (in busy's order), head group by head group, column group by column
  // group: task i is column group i % col_groups of head group i / col_groups % head_groups of sequence
  // busy[i / (head_groups * col_groups)].
  const int head_groups = (a.HV + head_group - 1) / head_group;
  const int64_t tasks_per_sequence = int64_t{head_groups} * col_groups;
  const auto num_tasks = static_cast<int64_t>(busy.size()) * tasks_per_sequence;
  const int64_t num_workers = std::min<int64_t>(threads, num_tasks);
  std::vector<ChunkWorker> workers;
  workers.reserve(static_cast<size_t>(num_workers * head_group));
  for (int64_t i = 0; i < num_workers * head_group; ++i) workers.emplace_back(kp, vp);

  std::atomic<int64_t> next_task{0};
  ParallelFor(num_workers, [&](int64_t worker) {
    ChunkGroupTask task;
    task.args = &a;
    task.scale = scale;
    for (int g = 0; g < head_group; ++g) {
      task.scratch[g] = workers[static_cast<size_t>(worker * head_group + g)].scratch();
    }
    for (int64_t i = next_task.fetch_add(1); i < num_tasks; i = next_task.fetch_add(1)) {
      const int64_t n = busy[static_cast<size_t>(i / tasks_per_sequence)];
      const auto h = static_cast<int>(i / col_groups % head_groups) * head_group;
      const auto g = static_cast<int>(i % col_groups);
      task.n = n;
      task.h = h;
      task.initial = SequenceInitialState(a, n);
      task.final = SequenceFinalState(a, n);
      task.heads = std::min(head_group, a.HV - h);
      task.v_begin = std::min(vp, blocks * g / col_groups * kernels.column_block);
      task.v_end = std::min(vp, blocks * (g + 1) / col_groups * kernels.column_block);
      kernels.chunk_task(task);
    }
  });
}

void FusedRecurrentKdaOptimizedUnchecked(const RecurrentKdaArgs& a, KernelIsa isa) {
  const int64_t num_tasks = a.N * a.HV;
  if (num_tasks == 0) return;
  const KernelTable& kernels = KernelsFor(isa);
  const float scale = EffectiveScale(a.options, a.K);
  const int64_t num_workers = std::min<int64_t>(std::max(1, NumThreads()), num_tasks);
  // One scratch state per worker (see RecurrentTask), written before it is read; kept per calling thread, so
  // that a steady stream of decode steps allocates nothing.
  const size_t state_size = Padded(static_cast<size_t>(a.K) * static_cast<size_t>(a.V));
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(num_workers) * state_size) {
    scratch.resize(static_cast<size_t>(num_workers) * state_size);
  }
  float* const scratch_base = scratch.data();  // the workers' threads see their own (empty) thread_local
  // Each worker takes a contiguous range of tasks: consecutive heads' states are adjacent in memory, one
  // stream for the hardware prefetchers (interleaving workers task by task measured ~25% slower at N = 1).
  ParallelFor(num_workers, [&](int64_t worker) {
    RecurrentTask task;
    task.args = &a;
    task.scale = scale;
    task.scratch = scratch_base + static_cast<size_t>(worker) * state_size;
    const int64_t first = num_tasks * worker / num_workers;
    const int64_t last = num_tasks * (worker + 1) / num_workers;
    for (int64_t i = first; i < last; ++i) {
      task.n = i / a.HV;
      task.h = static_cast<int>(i % a.HV);
      kernels.recurrent_task(task);
    }
  });
}

}  // namespace internal

void chunk_kda_optimized(const ChunkKdaArgs& a) {
  ValidateChunkKda(a);
  internal::ChunkKdaOptimizedUnchecked(a, ActiveKernelIsa());
}

void fused_recurrent_kda_optimized(const RecurrentKdaArgs& a) {
  ValidateRecurrentKda(a);
  internal::FusedRecurrentKdaOptimizedUnchecked(a, ActiveKernelIsa());
}

}  // namespace kda
