#include "kda/serving/seeded_drafts.h"

#include <algorithm>
#include <cstring>

#include "kda/base/error.h"

namespace kda {
namespace {

// splitmix64: a well-mixed 64-bit value from a counter.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

int64_t SeededAcceptedDrafts(uint64_t seed, int64_t committed, int64_t k, double alpha) {
  const uint64_t base = Mix(seed ^ Mix(static_cast<uint64_t>(committed)));
  int64_t a = 0;
  while (a < k) {
    const double u = static_cast<double>(Mix(base + static_cast<uint64_t>(a)) >> 11) * 0x1.0p-53;  // [0, 1)
    if (u >= alpha) break;
    ++a;
  }
  return a;
}

DraftSource SeededDraftSource(ConstBuf input, int64_t hidden, int64_t k, double alpha, uint64_t seed) {
  Check(k >= 0, "seeded drafts: k must be >= 0");
  Check(alpha >= 0.0 && alpha <= 1.0, "seeded drafts: alpha must be in [0, 1]");
  const size_t row = static_cast<size_t>(hidden) * DTypeSize(input.dtype);
  DraftSource d;
  d.propose = [=](int64_t committed, int64_t max_k, void* rows, int32_t* /*ids*/) {
    const int64_t n = std::min(k, max_k);
    const int64_t a = SeededAcceptedDrafts(seed, committed, n, alpha);
    const auto* src = static_cast<const uint8_t*>(input.data);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = committed + 1 + j;  // the true row this draft stands for
      void* dst = static_cast<uint8_t*>(rows) + static_cast<size_t>(j) * row;
      std::memcpy(dst, src + static_cast<size_t>(r) * row, row);
      if (j >= a) {
        for (int64_t c = 0; c < hidden; ++c) StoreFromFloat(dst, input.dtype, c, -LoadAsFloat(dst, input.dtype, c));
      }
    }
    return n;
  };
  d.accept = [=](int64_t committed, int64_t n, const void* /*out*/) {
    return SeededAcceptedDrafts(seed, committed, n, alpha);
  };
  return d;
}

}  // namespace kda
