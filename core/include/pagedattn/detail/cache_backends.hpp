// The internal seam between the cache-write API and the backends. Arguments arrive validated.
#pragma once

#include <cstdint>

#include "pagedattn/cache_ops.hpp"

namespace pagedattn::detail {

// Every slot_mapping entry (given in host memory) is -1 or in [0, num_blocks * block_size);
// else an Error naming slot_mapping[i] and the value. Shared by both backends.
void validate_slots(const CacheWriteArgs& args, const std::int32_t* slot_mapping);

namespace cpu {
// Host memory; every slot already checked.
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options);
// Host memory; every pair already checked.
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options);
}  // namespace cpu

namespace cuda {
// Device memory; the kernel skips any slot outside [0, num_blocks * block_size), and with
// options.check_device_slots the slots are checked on the host first.
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options);
// Device caches, host pairs (already checked).
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options);
}  // namespace cuda

}  // namespace pagedattn::detail
