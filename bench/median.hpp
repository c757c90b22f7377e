// The medians the benchmarks report: of samples taken (median: the CUDA timings and
// pagedattn-cp-bench), and of timed runs (median_ms: pagedattn-bench's CPU rows).
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "bench_clock.hpp"

namespace pagedattn::bench {

// The upper middle of the sorted samples (a sample that was measured, never an average of two), 0
// for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time (ms) of fn(i) on `clock` for i = 0, 1, ... after `warmup` untimed calls; min_time
// and max_time bound the runs in wall seconds.
inline double median_ms(const std::function<void(int)>& fn, int warmup, int min_iters,
                        double min_time, double max_time, Clock clock) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<double> ms;
  const double start = seconds_now(Clock::kWall);
  for (int i = warmup;; ++i) {
    const double t0 = seconds_now(clock);
    fn(i);
    ms.push_back(1e3 * (seconds_now(clock) - t0));
    const double total = seconds_now(Clock::kWall) - start;
    const int n = static_cast<int>(ms.size());
    if ((n >= min_iters && total >= min_time) || (n >= 3 && total >= max_time)) break;
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

}  // namespace pagedattn::bench
