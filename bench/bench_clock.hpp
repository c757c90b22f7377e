// The clock a CPU benchmark times with: wall time, or the calling thread's CPU time. On a shared
// host time slicing stretches a one-thread run's wall time by whatever else runs, but not the
// thread's own CPU time, so one-thread figures stay comparable there (`--clock thread-cpu`).
#pragma once

#include <time.h>

#include <chrono>

namespace pagedattn::bench {

enum class Clock { kWall, kThreadCpu };

// Seconds on `clock` since an arbitrary origin (fixed for a thread).
inline double seconds_now(Clock clock) {
  if (clock == Clock::kThreadCpu) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace pagedattn::bench
