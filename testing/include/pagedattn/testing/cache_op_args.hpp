// Cache-write and block-copy arguments for the tests: both name their pool by the same fields.
#pragma once

#include "pagedattn/cache_ops.hpp"

namespace pagedattn::testing {

// CacheWriteArgs or CopyBlocksArgs over a pool of num_blocks blocks of that geometry, its caches
// (host or device memory, as the backend) in cache_dtype and laid out by kv_strides (default:
// dense HND); every other field keeps its default.
template <typename CacheOpArgs>
CacheOpArgs pool_args(int num_kv_heads, int head_dim, int block_size, int num_blocks, void* k_cache,
                      void* v_cache, DType cache_dtype, const CacheStrides& kv_strides = {}) {
  CacheOpArgs a;
  a.num_kv_heads = num_kv_heads;
  a.head_dim = head_dim;
  a.block_size = block_size;
  a.num_blocks = num_blocks;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.cache_dtype = cache_dtype;
  a.kv_strides = kv_strides;
  return a;
}

}  // namespace pagedattn::testing
