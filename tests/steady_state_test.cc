// Steady-state properties that the kernels' timings depend on, asserted with
// deterministic counters instead of clocks: heap allocations per call (this
// test program counts every global operator new) and minor page faults per
// call (getrusage). A decode step after warm-up must neither allocate nor
// fault, and a fresh state slot's first write must not fault (the pool is
// touched when it is built, not inside a timed step).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/parallel.h"
#include "kda/bench/kernel_problems.h"
#include "kda/kernels/kda_args.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/delta_rule_geometry.h"
#include "kda/mem_cache/recurrent_state_pool.h"
#include "kda/mem_cache/recurrent_state_spec.h"

namespace {

std::atomic<int64_t> g_news{0};

// Counting replacements of the global allocation functions, every
// non-aligned form: the library's defaults of the array and nothrow forms
// would call these, but AddressSanitizer replaces each form itself, and a
// nothrow new of its own freed by the delete here is a mismatch it reports.
void* CountedMalloc(size_t bytes) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void* CountedNew(size_t bytes) {
  void* p = CountedMalloc(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(size_t bytes) { return CountedNew(bytes); }
void* operator new[](size_t bytes) { return CountedNew(bytes); }
void* operator new(size_t bytes, const std::nothrow_t& /*tag*/) noexcept { return CountedMalloc(bytes); }
void* operator new[](size_t bytes, const std::nothrow_t& /*tag*/) noexcept { return CountedMalloc(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t /*bytes*/) noexcept { std::free(p); }
void operator delete[](void* p, size_t /*bytes*/) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t& /*tag*/) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t& /*tag*/) noexcept { std::free(p); }

namespace kda {
namespace {

int64_t MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Heap allocations and minor page faults of one run of fn.
struct Counts {
  int64_t news = 0;
  int64_t faults = 0;
};

template <class Fn>
Counts Count(const Fn& fn) {
  const int64_t news0 = g_news.load();
  const int64_t faults0 = MinorFaults();
  fn();
  return {g_news.load() - news0, MinorFaults() - faults0};
}

// A few faults of slack for the runtime's own pages (a thread's first stack
// touch, the dynamic loader); far below the pages that the buffers span.
constexpr int64_t kFaultSlack = 4;

TEST(SteadyState, CountersSeeAllocationsAndFaults) {
  // The counters themselves: a vector allocates, and a fresh anonymous
  // mapping of 8 MiB touched page by page faults (at least once per 2 MiB
  // huge page). The mapping is the test's own: memory from the heap may be
  // pages that an earlier test's buffers already faulted in.
  const Counts c = Count([] {
    const std::vector<char> v(64, 1);
    ASSERT_EQ(v[1], 1);
  });
  EXPECT_GE(c.news, 1);
  constexpr size_t kBytes = size_t{8} << 20;
  void* map = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* bytes = static_cast<volatile char*>(map);
  const Counts f = Count([&] {
    for (size_t i = 0; i < kBytes; i += 4096) bytes[i] = 1;
  });
  ASSERT_EQ(munmap(map, kBytes), 0);
  EXPECT_GE(f.faults, 4);
}

TEST(SteadyState, ParallelForAllocatesNothing) {
  std::vector<int64_t> out(64, 0);
  const int64_t a = 3;
  const int64_t b = 5;
  const int64_t d = 7;
  // Captures more than two references: a std::function would allocate.
  auto body = [&](int64_t i) { out[static_cast<size_t>(i)] = a * i + b + d; };
  ParallelFor(64, body);  // warm-up: the thread team
  const Counts c = Count([&] {
    for (int r = 0; r < 10; ++r) ParallelFor(64, body);
  });
  EXPECT_EQ(c.news, 0);
  EXPECT_LE(c.faults, kFaultSlack);
  EXPECT_EQ(out[63], 3 * 63 + 12);
}

// Decode steps into a state pool's slots, as the serving path runs them: the
// first step into fresh slots and every step after warm-up neither allocate
// nor fault.
TEST(SteadyState, DecodeStepIntoPoolSlotsAllocatesAndFaultsNothing) {
  constexpr int kH = 4;
  constexpr int kK = 128;
  constexpr int64_t kN = 8;
  // 64 slots of 4 heads x 128 x 128 fp32 (256 KiB each): 16 MiB per layer.
  const RecurrentStateSpec spec = DeltaRuleGeometry::Kda(/*hidden=*/2304, kH, kK, /*conv_width=*/4, 1e-5).state_spec();
  RecurrentStatePool pool(/*num_layers=*/1, /*max_requests=*/64, spec, DType::kF32);
  bench::DecodeProblem p(kN, kH, kK, /*layers=*/1, DType::kF32);
  const LayerStateCache cache = pool.GetLayerCache(0);
  std::vector<int32_t> slots;
  // The highest slots: far from anything a smaller test would have touched.
  for (int64_t i = 0; i < 64; ++i) slots.push_back(pool.Alloc());
  for (int64_t i = 0; i < 64 - kN; ++i) pool.Free(slots[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < kN; ++i) p.indices[static_cast<size_t>(i)] = slots[static_cast<size_t>(64 - kN + i)];
  RecurrentKdaCall call = p.call;
  call.initial_state = ContiguousView<void*>(cache.recurrent, DType::kF32, {cache.num_slots, kH, kK, kK});

  for (KernelImpl impl : {KernelImpl::kReference, KernelImpl::kOptimized}) {
    SCOPED_TRACE(KernelImplName(impl));
    fused_recurrent_kda(call, impl);  // warm-up: thread team, per-thread validation scratch
    const Counts c = Count([&] {
      for (int r = 0; r < 10; ++r) fused_recurrent_kda(call, impl);
    });
    EXPECT_EQ(c.news, 0);
    EXPECT_LE(c.faults, kFaultSlack);
  }
}

TEST(SteadyState, FreshPoolSlotIsAlreadyFaultedIn) {
  constexpr int kH = 4;
  constexpr int kK = 128;
  constexpr int kLayers = 2;
  const RecurrentStateSpec spec = DeltaRuleGeometry::Kda(/*hidden=*/2304, kH, kK, /*conv_width=*/4, 1e-5).state_spec();
  RecurrentStatePool pool(kLayers, /*max_requests=*/64, spec, DType::kF32);
  // Allocating a slot zeroes it (touching it); so write through the layer
  // caches into slots that were never handed out, as a kernel would.
  const int64_t rs = spec.recurrent_size();
  const Counts c = Count([&] {
    for (int l = 0; l < kLayers; ++l) {
      float* state = pool.GetLayerCache(l).recurrent;
      for (int64_t slot = 1; slot <= 64; ++slot) {
        for (int64_t i = 0; i < rs; i += 1024) state[slot * rs + i] = 1.0F;  // one write per 4 KiB page
      }
    }
  });
  // 2 layers x 64 slots x 64 pages written (32 MiB): a lazily faulted pool
  // would fault on each 4 KiB page, or on each of 16 huge pages at least.
  EXPECT_EQ(c.news, 0);
  EXPECT_LE(c.faults, kFaultSlack);
}

}  // namespace
}  // namespace kda
