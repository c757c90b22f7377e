// Validation of write_cache and copy_blocks arguments, shared by the dispatch layer and both
// backends. Each throws pagedattn::Error naming the argument and the value. Not installed.
#pragma once

#include <cstdint>

#include "pagedattn/cache_ops.hpp"

namespace pagedattn::detail {

// Shapes, dtypes, strides and pointers of a cache write (slots are checked by validate_slots).
void validate_write_args(const CacheWriteArgs& args);
// The pool shape and every pair: ids in range, no dst twice, no dst that is also a src.
void validate_copy_args(const CopyBlocksArgs& args);
// Block-copy pairs (host memory) over a pool of num_blocks: ids in range (kOutOfRange naming
// pairs[i].src or .dst), no dst twice, no dst that is also a src.
void validate_block_pairs(const BlockCopy* pairs, int num_pairs, int num_blocks);
// Every slot_mapping entry (given in host memory) is -1 or in [0, num_blocks * block_size);
// else an Error naming slot_mapping[i] and the value.
void validate_slots(const CacheWriteArgs& args, const std::int32_t* slot_mapping);
// The per-kv-head fp8 scales of a write (either may be null), in host memory.
void validate_write_scales(const CacheWriteArgs& args, const float* k_scales,
                           const float* v_scales);

}  // namespace pagedattn::detail
