// What the CPU backend's cache operations share, for the GQA K/V cache and the MLA latent cache
// alike: the threads a call takes, one row converted into the cache, one block copied within a
// cache view. A latent part is a cache view of one kv head.
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/dtype.hpp"
#include "work_threads.hpp"

namespace pagedattn::detail::cpu {

// Threads for a call that moves `bytes` (read and written): as for decode, one per
// kMinBytesPerThread, so a small write runs on the calling thread without waking the team.
inline int cache_op_threads(const CacheOpOptions& o, std::int64_t bytes) {
  return threads_for_work(o.num_threads > 0 ? o.num_threads : omp_get_max_threads(), bytes);
}

// dst = src in Dst (cache_element: rounded to nearest even; a quantized Dst holds src / scale).
// Not for int4, whose bytes hold two codes.
template <typename Src, typename Dst>
void convert_row(const Src* __restrict src, Dst* __restrict dst, int n, float scale) {
  if constexpr (std::is_same_v<Src, Dst>) {
    std::memcpy(dst, src, sizeof(Src) * n);
  } else {
    for (int i = 0; i < n; ++i) dst[i] = cache_element<Dst>(to_float(src[i]), scale);
  }
}

// Copies block p.src onto block p.dst in the cache view `layout` of `base` (every kv head and
// slot): one memcpy when a block's rows fill one span (HND, NHD), else one per row (a padded
// pool, K and V interleaved, a latent part of a combined cache). Bytes through dtype_bytes, so
// int4's offsets, validated even, count codes.
inline void copy_block(unsigned char* base, const CacheLayout& layout, DType dtype,
                       const BlockCopy& p) {
  const auto bytes_of = [&](std::int64_t n) { return dtype_bytes(dtype, n); };
  const std::int64_t row_bytes = bytes_of(layout.head_dim);
  const std::int64_t rows = static_cast<std::int64_t>(layout.num_kv_heads) * layout.block_size;
  const std::int64_t span = bytes_of(
      layout.elements() - static_cast<std::int64_t>(layout.num_blocks - 1) * layout.block_stride);
  if (span == rows * row_bytes) {
    std::memcpy(base + bytes_of(layout.offset(p.dst, 0, 0)),
                base + bytes_of(layout.offset(p.src, 0, 0)), static_cast<std::size_t>(span));
    return;
  }
  for (int h = 0; h < layout.num_kv_heads; ++h) {
    for (int t = 0; t < layout.block_size; ++t) {
      std::memcpy(base + bytes_of(layout.offset(p.dst, h, t)),
                  base + bytes_of(layout.offset(p.src, h, t)), static_cast<std::size_t>(row_bytes));
    }
  }
}

}  // namespace pagedattn::detail::cpu
