// The seam between the dispatch layer's cache writes and the backends: what each backend
// implements. Arguments arrive validated. Not installed.
#pragma once

#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/cache_validate.hpp"

namespace pagedattn::detail {

namespace cpu {
// Host memory; every slot already checked.
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options);
// Host memory; every pair already checked.
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options);
}  // namespace cpu

namespace cuda {
// Device memory; the kernel skips any slot outside [0, num_blocks * block_size), and with
// options.cuda_checked the slots are checked on the host first.
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options);
// Device caches, host pairs (already checked).
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options);
}  // namespace cuda

}  // namespace pagedattn::detail
