// A reusable barrier for the rank threads of pagedattn-cp-bench: spinning (with yields) rather
// than sleeping on a condition variable, so that the ranks leave it within microseconds of each
// other and start a timed sample together.
#pragma once

#include <atomic>
#include <stdexcept>
#include <thread>

namespace pagedattn::bench {

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    if (aborted_.load(std::memory_order_acquire)) throw std::runtime_error("another rank failed");
    const int gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == gen) {
      if (aborted_.load(std::memory_order_acquire)) {
        throw std::runtime_error("another rank failed");
      }
      std::this_thread::yield();
    }
  }
  // Every wait, now and later, throws instead of waiting: a rank failed.
  void abort() { aborted_.store(true, std::memory_order_release); }

 private:
  const int n_;
  std::atomic<bool> aborted_{false};
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
};

}  // namespace pagedattn::bench
