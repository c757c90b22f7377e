// Test-only fault injection: plants a known bug in a backend so the fuzzer can prove it catches
// it. Never set in production; the check costs one relaxed atomic load per work item.
#pragma once

#include <atomic>

namespace pagedattn::detail {

enum class Fault : int {
  kNone = 0,
  kLastBlockOffByOne,  // a partial last block reads one slot past the context
  kWrongKvHead,        // kv head 1 reads kv head 0's keys and values
  kDropSplit,          // the combine ignores the last split of a split sequence
};

inline std::atomic<int>& fault_slot() {
  static std::atomic<int> slot{0};
  return slot;
}
inline void set_fault(Fault f) { fault_slot().store(static_cast<int>(f)); }
inline Fault active_fault() {
  return static_cast<Fault>(fault_slot().load(std::memory_order_relaxed));
}

}  // namespace pagedattn::detail
