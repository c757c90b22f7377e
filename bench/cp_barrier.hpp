// A reusable barrier for the rank threads of pagedattn-cp-bench: spinning (with yields) rather
// than sleeping on a condition variable, so that the ranks leave it within microseconds of each
// other and start a timed sample together.
#pragma once

#include <atomic>
#include <thread>

namespace pagedattn::bench {

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const int gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
};

}  // namespace pagedattn::bench
