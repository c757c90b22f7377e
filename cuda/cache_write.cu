// Cache writes on the CUDA backend (the kernels in cache_rows.cuh, shared with the MLA cache's).
// write_cache: K and V as the two views of write_kernel (with per-token scales, one warp per row
// instead: the scale needs the row's largest value); copy_blocks: K and V as the two views of
// copy_kernel, then the per-token scales. Both take the caches' layout (kv_strides).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cache_rows.cuh"
#include "cuda_error.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/cache_backends.hpp"
#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cuda {
namespace {

constexpr int kThreads = kCacheThreads;

// The scales of a quantized cache (CacheWriteArgs::k_scale and the rest): the cache holds x /
// scale.
struct WriteScales {
  float k, v;
  const float* k_per_head;  // or null
  const float* v_per_head;
};

// Where the caches take per-token scales.
struct TokenScales {
  float* k;
  float* v;
  CacheLayout layout;  // CacheWriteArgs::token_scale_layout()
  float max_code;      // max_code_magnitude(cache_dtype)
};

// The largest finite |x| of a row of n elements, over the warp (exact in any order).
template <typename Src>
__device__ float warp_finite_amax(const Src* row, int n, int lane) {
  float amax = 0.f;
  for (int d = lane; d < n; d += 32) {
    const float x = fabsf(to_float(row[d]));
    if (isfinite(x)) amax = fmaxf(amax, x);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return amax;
}

// One row (token, kv head) of a quantized cache with per-token scales per warp: its scale as the
// CPU backend computes it (row_token_scale of the row's largest finite |x| under the head's
// scale) and its codes under head scale x that scale.
template <typename Src, typename Dst>
__device__ void quantize_row(const Src* src, Dst* dst, int n, float head, float max_code,
                             float* scale, int lane) {
  const float s = row_token_scale(warp_finite_amax(src, n, lane), max_code, head);
  if (lane == 0) *scale = s;
  for (int d = lane; d < n; d += 32) dst[d] = quantize_scaled<Dst>(to_float(src[d]), head * s);
}

constexpr int kRowsPerBlock = kThreads / 32;

template <typename Src, typename Dst>
__global__ void write_rows_kernel(const Src* __restrict__ key, const Src* __restrict__ value,
                                  std::int64_t src_stride, const std::int32_t* __restrict__ slots,
                                  int num_tokens, Dst* k_cache, Dst* v_cache, CacheLayout layout,
                                  WriteScales scales, TokenScales token) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= static_cast<std::int64_t>(num_tokens) * layout.num_kv_heads) return;
  const int t = static_cast<int>(r / layout.num_kv_heads);
  const int h = static_cast<int>(r % layout.num_kv_heads);
  const std::int32_t slot = slots[t];
  const std::int64_t num_slots = static_cast<std::int64_t>(layout.num_blocks) * layout.block_size;
  if (slot < 0 || slot >= num_slots) return;  // as write_kernel
  const int block = slot / layout.block_size, offset = slot % layout.block_size;
  const std::int64_t src = t * src_stride + static_cast<std::int64_t>(h) * layout.head_dim;
  const std::int64_t dst = layout.offset(block, h, offset);
  const std::int64_t at = token.layout.offset(block, h, offset);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  quantize_row(key + src, k_cache + dst, layout.head_dim,
               head_scale(scales.k, scales.k_per_head, h), token.max_code, token.k + at, lane);
  quantize_row(value + src, v_cache + dst, layout.head_dim,
               head_scale(scales.v, scales.v_per_head, h), token.max_code, token.v + at, lane);
}

template <typename Src, typename Dst>
void launch_write(const CacheWriteArgs& a, cudaStream_t stream) {
  const CacheLayout layout = a.cache_layout();
  const WriteScales scales{a.k_scale, a.v_scale, a.k_scales, a.v_scales};
  if constexpr (is_quantized_type<Dst>) {
    if (a.k_token_scales != nullptr) {
      const std::int64_t rows = static_cast<std::int64_t>(a.num_tokens) * a.num_kv_heads;
      const TokenScales token{a.k_token_scales, a.v_token_scales, a.token_scale_layout(),
                              max_code_magnitude(a.cache_dtype)};
      write_rows_kernel<Src, Dst>
          <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0,
             stream>>>(static_cast<const Src*>(a.key), static_cast<const Src*>(a.value),
                       a.token_stride(), a.slot_mapping, a.num_tokens, static_cast<Dst*>(a.k_cache),
                       static_cast<Dst*>(a.v_cache), layout, scales, token);
      return;
    }
  }
  const WriteView<Src, Dst> k{static_cast<const Src*>(a.key),
                              a.token_stride(),
                              static_cast<Dst*>(a.k_cache),
                              layout,
                              a.k_scale,
                              a.k_scales};
  const WriteView<Src, Dst> v{static_cast<const Src*>(a.value),
                              a.token_stride(),
                              static_cast<Dst*>(a.v_cache),
                              layout,
                              a.v_scale,
                              a.v_scales};
  write_kernel<Src, Dst><<<a.num_tokens, kThreads, 0, stream>>>(k, v, a.slot_mapping);
}

// The cache dtypes with a CUDA kernel: all but int4 (require_cuda_cache_dtype).
using CudaCacheTypes = TypeList<float, f16_t, bf16_t, fp8_e4m3_t, fp8_e5m2_t, int8_code_t>;

// The per-token scales of each pair's blocks, as copy_kernel copies the rows: grid.x = pairs in
// the chunk, grid.y = 0 for K, 1 for V.
__global__ void copy_scales_kernel(float* k_scales, float* v_scales, CacheLayout layout,
                                   PairChunk chunk) {
  const BlockCopy p = chunk.pairs[blockIdx.x];
  float* base = blockIdx.y == 0 ? k_scales : v_scales;
  for (int i = threadIdx.x; i < layout.num_kv_heads * layout.block_size; i += blockDim.x) {
    const int h = i / layout.block_size, t = i % layout.block_size;
    base[layout.offset(p.dst, h, t)] = base[layout.offset(p.src, h, t)];
  }
}

// The per-token scales of each pair's blocks, after their rows.
void copy_token_scales(const CopyBlocksArgs& a, cudaStream_t stream) {
  for (int first = 0; first < a.num_pairs; first += kPairsPerLaunch) {
    const int n = a.num_pairs - first < kPairsPerLaunch ? a.num_pairs - first : kPairsPerLaunch;
    PairChunk chunk{};
    for (int i = 0; i < n; ++i) chunk.pairs[i] = a.pairs[first + i];
    copy_scales_kernel<<<dim3(n, 2), kThreads, 0, stream>>>(a.k_token_scales, a.v_token_scales,
                                                            a.token_scale_layout(), chunk);
    check(cudaGetLastError(), "copy_blocks kernel launch (token scales)");
  }
}

void copy_back(std::vector<float>& dst, const float* src, cudaStream_t stream) {
  check(
      cudaMemcpyAsync(dst.data(), src, dst.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "scales copy to host");
  check(cudaStreamSynchronize(stream), "scales copy to host");
}

// Per-token scales are written a float at a time.
void require_token_scales_aligned(const float* k, const float* v) {
  if (k != nullptr && !aligned(k, 4)) {
    fail(ErrorCode::kInvalidArgument, "k_token_scales", static_cast<const void*>(k),
         "must be 4-byte aligned for the CUDA backend");
  }
  if (v != nullptr && !aligned(v, 4)) {
    fail(ErrorCode::kInvalidArgument, "v_token_scales", static_cast<const void*>(v),
         "must be 4-byte aligned for the CUDA backend");
  }
}

}  // namespace

void write_cache(const CacheWriteArgs& a, const CacheOpOptions& o) {
  const auto stream = static_cast<cudaStream_t>(o.cuda_stream);
  require_token_scales_aligned(a.k_token_scales, a.v_token_scales);
  if (o.cuda_checked) {
    validate_slots(a, slots_on_host(a.slot_mapping, a.num_tokens, stream).data());
    std::vector<float> ks(a.k_scales ? a.num_kv_heads : 0), vs(a.v_scales ? a.num_kv_heads : 0);
    if (a.k_scales != nullptr) copy_back(ks, a.k_scales, stream);
    if (a.v_scales != nullptr) copy_back(vs, a.v_scales, stream);
    validate_write_scales(a, a.k_scales ? ks.data() : nullptr, a.v_scales ? vs.data() : nullptr);
  }
  visit_value_type(a.src_dtype, "src_dtype", [&](auto src) {
    visit_accepted_type(CudaCacheTypes{}, a.cache_dtype, "cache_dtype", [&](auto cache) {
      launch_write<typename decltype(src)::type, typename decltype(cache)::type>(a, stream);
    });
  });
  check(cudaGetLastError(), "write_cache kernel launch");
}

void copy_blocks(const CopyBlocksArgs& a, const CacheOpOptions& o) {
  const auto stream = static_cast<cudaStream_t>(o.cuda_stream);
  require_token_scales_aligned(a.k_token_scales, a.v_token_scales);
  const CacheLayout l = a.cache_layout();
  copy_views(a.k_cache, l, a.v_cache, l, a.cache_dtype, a.pairs, a.num_pairs, stream);
  if (a.k_token_scales != nullptr) copy_token_scales(a, stream);
}

}  // namespace pagedattn::detail::cuda
