// What the CUDA backend's cache operations share, for the GQA K/V cache and the MLA latent cache
// alike: a cache view is a CacheLayout (a latent part is one of one kv head), and each kernel
// moves two views of one pool at once (K and V, or c and k_pe). write_kernel: one thread block
// per token, its threads over the token's elements; a slot outside the pool is skipped, so no
// input can make it write out of bounds. copy_kernel: one thread block per (pair, view), the pairs
// passed by value in the kernel's parameters (no device allocation, stream-ordered).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda_error.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cuda {

constexpr int kCacheThreads = 256;

// One view a write fills: token t's row of num_kv_heads * head_dim elements at src + t *
// src_stride goes to its slot's rows of `cache`, a quantized cache holding x / (scale x
// per_head[h]) (per_head null: scale alone).
template <typename Src, typename Dst>
struct WriteView {
  const Src* src;
  std::int64_t src_stride;
  Dst* cache;
  CacheLayout layout;
  float scale;
  const float* per_head;
};

// View v's elements of token t, written into slot `offset` of block `block`.
template <typename Src, typename Dst>
__device__ void write_token(const WriteView<Src, Dst>& v, int t, int block, int offset) {
  const int row = v.layout.num_kv_heads * v.layout.head_dim;
  for (int i = threadIdx.x; i < row; i += blockDim.x) {
    const int h = i / v.layout.head_dim;
    const int d = i % v.layout.head_dim;
    const float x = to_float(v.src[t * v.src_stride + i]);
    v.cache[v.layout.offset(block, h, offset) + d] =
        cache_element<Dst>(x, head_scale(v.scale, v.per_head, h));
  }
}

// grid.x = tokens. Both views share the pool (num_blocks, block_size: a's layout's).
template <typename Src, typename Dst>
__global__ void write_kernel(WriteView<Src, Dst> a, WriteView<Src, Dst> b,
                             const std::int32_t* __restrict__ slots) {
  const int t = blockIdx.x;
  const std::int32_t slot = slots[t];
  const std::int64_t num_slots =
      static_cast<std::int64_t>(a.layout.num_blocks) * a.layout.block_size;
  if (slot < 0 || slot >= num_slots) return;  // negative skips; anything else out of range too
  const int block = slot / a.layout.block_size;
  const int offset = slot % a.layout.block_size;
  write_token(a, t, block, offset);
  write_token(b, t, block, offset);
}

// Pairs per launch: 256 pairs of int32 are 2 KiB of kernel parameters, well under the 4 KiB limit.
constexpr int kPairsPerLaunch = 256;
struct PairChunk {
  BlockCopy pairs[kPairsPerLaunch];
};

// One view a block copy moves, counted in Words: every stride and head_dim of `words` in Words.
template <typename Word>
struct CopyView {
  Word* cache;
  CacheLayout words;
};

// grid.x = pairs in the chunk, grid.y = 0 for view a, 1 for b. A block's rows are copied one
// Word per thread at a time.
template <typename Word>
__global__ void copy_kernel(CopyView<Word> a, CopyView<Word> b, PairChunk chunk) {
  const BlockCopy p = chunk.pairs[blockIdx.x];
  const CopyView<Word>& v = blockIdx.y == 0 ? a : b;
  const int row = v.words.head_dim;
  const int total = v.words.num_kv_heads * v.words.block_size * row;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / row, w = i % row;
    const int h = r / v.words.block_size, t = r % v.words.block_size;
    v.cache[v.words.offset(p.dst, h, t) + w] = v.cache[v.words.offset(p.src, h, t) + w];
  }
}

// A write's slot_mapping (device memory) on the host, for checked mode to validate; waits for
// `stream`.
inline std::vector<std::int32_t> slots_on_host(const std::int32_t* slot_mapping, int num_tokens,
                                               cudaStream_t stream) {
  std::vector<std::int32_t> host(num_tokens);
  check(cudaMemcpyAsync(host.data(), slot_mapping, sizeof(std::int32_t) * num_tokens,
                        cudaMemcpyDeviceToHost, stream),
        "slot_mapping copy to host");
  check(cudaStreamSynchronize(stream), "slot_mapping copy to host");
  return host;
}

inline bool aligned(const void* p, std::size_t n) {
  return reinterpret_cast<std::uintptr_t>(p) % n == 0;
}

// Copies each pair's block in two views of one pool of `dtype` elements, in the widest Word (16,
// 4, 2 or 1 bytes) that every stride, row and pointer of both allows.
inline void copy_views(void* a, const CacheLayout& la, void* b, const CacheLayout& lb, DType dtype,
                       const BlockCopy* pairs, int num_pairs, cudaStream_t stream) {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(dtype));
  const auto fits_view = [&](const void* p, const CacheLayout& l, std::int64_t n) {
    return l.block_stride * elem % n == 0 && l.head_stride * elem % n == 0 &&
           l.token_stride * elem % n == 0 && l.head_dim * elem % n == 0 &&
           aligned(p, static_cast<std::size_t>(n));
  };
  const auto launch = [&](auto word) {
    using Word = decltype(word);
    const std::int64_t per = static_cast<std::int64_t>(sizeof(Word)) / elem;
    const auto view = [&](void* p, CacheLayout l) {
      l.block_stride /= per;
      l.head_stride /= per;
      l.token_stride /= per;
      l.head_dim = static_cast<int>(l.head_dim / per);
      return CopyView<Word>{static_cast<Word*>(p), l};
    };
    for (int first = 0; first < num_pairs; first += kPairsPerLaunch) {
      const int n = num_pairs - first < kPairsPerLaunch ? num_pairs - first : kPairsPerLaunch;
      PairChunk chunk{};
      for (int i = 0; i < n; ++i) chunk.pairs[i] = pairs[first + i];
      copy_kernel<Word><<<dim3(n, 2), kCacheThreads, 0, stream>>>(view(a, la), view(b, lb), chunk);
      check(cudaGetLastError(), "copy_blocks kernel launch");
    }
  };
  for (std::int64_t n : {16, 4, 2}) {
    if (!fits_view(a, la, n) || !fits_view(b, lb, n)) continue;
    if (n == 16) return launch(uint4{});
    if (n == 4) return launch(std::uint32_t{});
    return launch(std::uint16_t{});
  }
  launch(std::uint8_t{});  // 8-bit codes with odd strides
}

}  // namespace pagedattn::detail::cuda
