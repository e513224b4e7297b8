// Wall-clock timing for the CLI's benchmarks (`kda bench-kernels`, `kda
// bench --vs-one-shot`): medians of repeated calls, which a slow spell of a
// shared machine moves less than a mean.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace kda::bench {

using Clock = std::chrono::steady_clock;

// Seconds since t0.
inline double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The median of x (the mean of the middle two for an even count); x is not empty.
inline double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// The median and the best (shortest) of repeated timings, in seconds. The
// best is the least disturbed call: beside a ceiling that is itself a best
// (the FMA peak), it tells the kernel's own cost from a slow spell's.
struct RepeatedSeconds {
  double median = 0.0;
  double best = 0.0;
};

// Times fn `repeats` (>= 1) times.
inline RepeatedSeconds TimeRepeats(int repeats, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point t0 = Clock::now();
    fn();
    t.push_back(Seconds(t0));
  }
  return {Median(t), *std::min_element(t.begin(), t.end())};
}

// Times `rounds` rounds of fns[0](i), fns[1](i), ... (i the round), each call
// timed alone, the calls of a round in turn, so that a slow spell of the
// machine hits all of them; returns each function's seconds, round by round.
inline std::vector<std::vector<double>> TimeAlternately(int64_t rounds,
                                                        const std::vector<std::function<void(int64_t)>>& fns) {
  std::vector<std::vector<double>> t(fns.size());
  for (std::vector<double>& v : t) v.reserve(static_cast<size_t>(rounds));  // nothing allocated between clock reads
  for (int64_t i = 0; i < rounds; ++i) {
    for (size_t f = 0; f < fns.size(); ++f) {
      const Clock::time_point t0 = Clock::now();
      fns[f](i);
      t[f].push_back(Seconds(t0));
    }
  }
  return t;
}

// Times fn `repeats` (>= 1) times; returns the median in seconds.
inline double MedianSeconds(int repeats, const std::function<void()>& fn) { return TimeRepeats(repeats, fn).median; }

}  // namespace kda::bench
