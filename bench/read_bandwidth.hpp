// The machine's read bandwidth, measured the way decode reads its cache: several threads each
// streaming through its own part of a buffer far larger than the last-level cache, with the
// widest loads the CPU has (AVX-512 where present, with and without a software prefetch; the
// faster counts).
#pragma once

#include <cstddef>
#include <vector>

#include "bench_clock.hpp"

namespace pagedattn::bench {

// Best of `repeats` timed passes per kernel over a `bytes` buffer (first touched by the same
// threads), in GB/s (1e9 bytes per second), timed on `clock` (the thread-CPU clock only with one
// thread, which runs on the caller).
double measure_read_bandwidth_gbps(std::size_t bytes, int threads, int repeats = 5,
                                   Clock clock = Clock::kWall);

// A run of memory one thread reads in order: a task of a pattern read.
struct ReadRange {
  const char* begin;
  std::size_t bytes;  // a multiple of 64 (the loads are whole cache lines)
};
using ReadTask = std::vector<ReadRange>;

// Seconds, on `clock`, that one pass over `tasks` takes on `threads` threads: each task's ranges
// read in order by one thread, the tasks shared out dynamically, with the same loads as the
// streaming measurement (the widest the CPU has, a software prefetch 2 KB ahead). What a kernel
// reading those bytes in that order could reach with no arithmetic at all.
double time_read_tasks(const std::vector<ReadTask>& tasks, int threads, Clock clock = Clock::kWall);

// Bytes of the last-level cache, or a conservative guess when the system does not say.
std::size_t last_level_cache_bytes();

}  // namespace pagedattn::bench
