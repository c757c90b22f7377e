// The naive CUDA decode (naive_decode.hpp): a CTA per (sequence, query head) walks its context
// one token at a time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/error.hpp"
#include "pagedattn/testing/cuda_check.hpp"
#include "pagedattn/testing/naive_decode.hpp"

namespace pagedattn::testing {
namespace {

struct NaiveParams {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const std::int32_t* block_table;
  const std::int32_t* context_lens;
  const float* sinks;  // natural-log units, or null
  const float* alibi;  // or null
  void* out;
  float* lse;
  long long block_stride, head_stride, token_stride, table_stride;
  int num_heads, group, head_dim, block_size, window_left;
  float scale, cap, k_scale, v_scale;
};

__device__ float as_float(float x) { return x; }
__device__ float as_float(__half x) { return __half2float(x); }
__device__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ void store(float* p, float x) { *p = x; }
__device__ void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// The sum of x over the CTA, returned to every thread (red: one float per warp).
__device__ float cta_sum(float x, float* red) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warps = (blockDim.x + 31) / 32;
  __syncthreads();  // red is free: every thread has read the previous sum
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += red[w];
  return total;
}

template <typename T>
__global__ void naive_kernel(NaiveParams p) {
  __shared__ float red[8];
  const int b = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads, kv = h / p.group;
  const int d = threadIdx.x;
  const bool lane_in = d < p.head_dim;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * p.head_dim;
  const float q = lane_in ? as_float(static_cast<const T*>(p.q)[row + d]) : 0.f;
  const int L = p.context_lens[b];
  const int first = p.window_left >= 0 && L - 1 - p.window_left > 0 ? L - 1 - p.window_left : 0;
  const float slope = p.alibi != nullptr ? p.alibi[h] : 0.f;
  float m = -INFINITY, l = 0.f, acc = 0.f;
  for (int t = first; t < L; ++t) {
    const std::int32_t block = p.block_table[b * p.table_stride + t / p.block_size];
    const std::int64_t at = static_cast<std::int64_t>(block) * p.block_stride + kv * p.head_stride +
                            (t % p.block_size) * p.token_stride + d;
    const float k = lane_in ? as_float(static_cast<const T*>(p.k_cache)[at]) : 0.f;
    float s = cta_sum(q * k, red) * p.scale * p.k_scale;
    if (p.cap > 0.f) s = p.cap * tanhf(s / p.cap);
    s += slope * static_cast<float>(t - (L - 1));
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new), w = expf(s - m_new);
    const float v = lane_in ? as_float(static_cast<const T*>(p.v_cache)[at]) : 0.f;
    l = l * alpha + w;
    acc = acc * alpha + w * v;
    m = m_new;
  }
  // A sink joins the denominator only.
  if (p.sinks != nullptr) {
    const float sink = p.sinks[h], m_new = fmaxf(m, sink), alpha = expf(m - m_new);
    l = l * alpha + expf(sink - m_new);
    acc *= alpha;
    m = m_new;
  }
  if (lane_in) store(static_cast<T*>(p.out) + row + d, l > 0.f ? acc * p.v_scale / l : 0.f);
  if (p.lse != nullptr && d == 0) p.lse[blockIdx.x] = l > 0.f ? m + logf(l) : -INFINITY;
}

}  // namespace

void naive_decode_cuda(const DecodeArgs& a) {
  if (a.q_indptr != nullptr) {
    fail(ErrorCode::kUnsupported, "q_indptr", "set", "the naive CUDA decode takes one query token");
  }
  if (a.k_dtype != a.q_dtype || a.v_dtype != a.q_dtype || a.out_dtype != a.q_dtype) {
    fail(ErrorCode::kUnsupported, "k_dtype", dtype_name(a.k_dtype),
         "the naive CUDA decode needs q, k, v and out of one dtype");
  }
  if (a.head_dim > 256 || a.k_scales != nullptr || a.v_scales != nullptr) {
    fail(ErrorCode::kUnsupported, "head_dim", a.head_dim,
         "the naive CUDA decode takes head dims up to 256 and per-tensor scales");
  }
  const CacheLayout layout = a.cache_layout();
  NaiveParams p{a.q,
                a.k_cache,
                a.v_cache,
                a.block_table,
                a.context_lens,
                a.sinks,
                a.alibi_slopes,
                a.out,
                a.lse,
                layout.block_stride,
                layout.head_stride,
                layout.token_stride,
                a.table_stride(),
                a.num_heads,
                a.group_size(),
                a.head_dim,
                a.block_size,
                a.window_left,
                a.effective_scale(),
                a.logits_soft_cap,
                a.k_scale,
                a.v_scale};
  const dim3 grid(static_cast<unsigned>(a.batch * a.num_heads));
  const dim3 block(static_cast<unsigned>((a.head_dim + 31) / 32 * 32));
  switch (a.q_dtype) {
    case DType::kF32:
      naive_kernel<float><<<grid, block>>>(p);
      break;
    case DType::kF16:
      naive_kernel<__half><<<grid, block>>>(p);
      break;
    case DType::kBF16:
      naive_kernel<__nv_bfloat16><<<grid, block>>>(p);
      break;
    default:
      fail(ErrorCode::kUnsupported, "q_dtype", dtype_name(a.q_dtype),
           "the naive CUDA decode takes f32, f16 and bf16");
  }
  check_cuda(cudaGetLastError(), "naive_kernel launch");
}

}  // namespace pagedattn::testing
