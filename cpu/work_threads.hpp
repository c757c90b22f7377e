// How many threads a CPU call uses: sized to the bytes it moves, so a small call runs on the
// calling thread alone, without a parallel region (no wake-ups, no barriers).
#pragma once

#include <cstdint>

namespace pagedattn::detail::cpu {

// Bytes a call must move per thread before it takes one more thread.
constexpr std::int64_t kMinBytesPerThread = std::int64_t{8} << 20;

// Threads for a call that moves `bytes` with `requested` threads allowed: one per
// kMinBytesPerThread, at least 1, at most requested.
int threads_for_work(int requested, std::int64_t bytes);

}  // namespace pagedattn::detail::cpu
