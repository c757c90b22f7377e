// The seam between the dispatch layer's cache writes and the backends: what each backend
// implements. Arguments arrive validated. Not installed.
#pragma once

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/cache_validate.hpp"
#include "pagedattn/detail/mla_cache_validate.hpp"
#include "pagedattn/detail/visit_dtype.hpp"
#include "pagedattn/mla_cache.hpp"

namespace pagedattn::detail {

// A latent part (c or k_pe) as the cache view of one kv head that the GQA cache operations'
// pieces move: rows of `width` elements at the part's strides.
inline CacheLayout mla_part_view(const MlaPartStrides& strides, int num_blocks, int block_size,
                                 int width) {
  const MlaPartStrides s = strides.or_dense(block_size, width);
  CacheLayout l = CacheLayout::dense(num_blocks, 1, block_size, width);
  l.block_stride = s.block;
  l.head_stride = s.block;  // one kv head: never stepped over
  l.token_stride = s.token;
  return l;
}

// The storage types of a latent cache (validate_mla_cache_shape): f32, f16, bf16 or fp8.
using MlaCacheTypes = TypeList<float, f16_t, bf16_t, fp8_e4m3_t, fp8_e5m2_t>;

namespace cpu {
// Host memory; every slot already checked.
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options);
// Host memory; every pair already checked.
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options);
// The latent cache (pagedattn/mla_cache.hpp), host memory; every slot, every pair checked.
void write_mla_cache(const MlaCacheWriteArgs& args, const CacheOpOptions& options);
void copy_blocks(const MlaCopyBlocksArgs& args, const CacheOpOptions& options);
}  // namespace cpu

namespace cuda {
// Device memory; the kernel skips any slot outside [0, num_blocks * block_size), and with
// options.cuda_checked the slots are checked on the host first.
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options);
// Device caches, host pairs (already checked).
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options);
// The latent cache, as write_cache and copy_blocks: device memory, negative slots skipped.
void write_mla_cache(const MlaCacheWriteArgs& args, const CacheOpOptions& options);
void copy_blocks(const MlaCopyBlocksArgs& args, const CacheOpOptions& options);
}  // namespace cuda

}  // namespace pagedattn::detail
