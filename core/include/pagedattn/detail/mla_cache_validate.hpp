// Validation of write_mla_cache and the MLA copy_blocks (pagedattn/mla_cache.hpp), shared by the
// dispatch layer and both backends. Each throws pagedattn::Error naming the argument and the
// value. Not installed.
#pragma once

#include <cstdint>

#include "pagedattn/mla_cache.hpp"

namespace pagedattn::detail {

// Shapes, dtypes, strides, kv_scale and pointers of a latent cache write (the slots are checked
// by validate_mla_slots).
void validate_mla_write_args(const MlaCacheWriteArgs& args);
// Every slot_mapping entry (given in host memory) negative (skipped) or in
// [0, num_blocks * block_size), and no non-negative slot twice.
void validate_mla_slots(const MlaCacheWriteArgs& args, const std::int32_t* slot_mapping);
// The latent pool and every pair: ids in range, no dst twice, no dst that is also a src.
void validate_mla_copy_args(const MlaCopyBlocksArgs& args);

}  // namespace pagedattn::detail
