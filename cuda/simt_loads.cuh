// The row reads of the CUDA-core path (simt_path.cuh): q's elements in its own dtype, and a lane's
// elements of a K or V row of a tile, each as f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "fp8_convert.cuh"
#include "kv_pipeline.cuh"
#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cuda {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(fp8_e4m3_t x) { return fp8_e4m3_to_float(x); }
__device__ __forceinline__ float to_f(fp8_e5m2_t x) { return fp8_e5m2_to_float(x); }
__device__ __forceinline__ float to_f(int8_code_t x) { return static_cast<float>(x.bits); }

__device__ __forceinline__ float load_q(const void* q, int dtype, std::int64_t i) {
  if (dtype == 0) return static_cast<const float*>(q)[i];
  if (dtype == 1) return __half2float(static_cast<const __half*>(q)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(q)[i]);
}

// Lane l16's E elements of row r of a tile (words never straddle a 16-byte chunk, so each is
// found through the tile's chunk layout).
template <typename T, int D, int E>
__device__ __forceinline__ void load_slice(const char* tile, int r, int l16, float (&out)[E]) {
  constexpr int kBytes = E * static_cast<int>(sizeof(T));
  constexpr int kAlign = kBytes % 16 == 0  ? 16
                         : kBytes % 8 == 0 ? 8
                         : kBytes % 4 == 0 ? 4
                         : kBytes % 2 == 0 ? 2
                                           : 1;  // 8-bit codes with an odd E (dims 80, 112)
  constexpr int kWords = kBytes / kAlign;
  using W = typename std::conditional<
      kAlign == 16, uint4,
      typename std::conditional<
          kAlign == 8, uint2,
          typename std::conditional<kAlign == 4, std::uint32_t,
                                    typename std::conditional<kAlign == 2, std::uint16_t,
                                                              std::uint8_t>::type>::type>::type>::
      type;
  W w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const int byte = l16 * kBytes + i * kAlign;
    w[i] = *reinterpret_cast<const W*>(tile + RowGeom<T, D>::offset(r, byte / 16) + byte % 16);
  }
  if constexpr (is_fp8_type<T>) {
    // Two codes at a time through f16 (exact: fp8_convert.cuh).
    constexpr __nv_fp8_interpretation_t kKind =
        std::is_same_v<T, fp8_e4m3_t> ? __NV_E4M3 : __NV_E5M2;
    const std::uint8_t* b = reinterpret_cast<const std::uint8_t*>(w);
#pragma unroll
    for (int i = 0; i + 1 < E; i += 2) {
      const __nv_fp8x2_storage_t pair =
          static_cast<__nv_fp8x2_storage_t>(b[i] | (static_cast<unsigned>(b[i + 1]) << 8));
      const __half2 h = fp8x2_to_half2(pair, kKind);
      const float2 f = __half22float2(h);
      out[i] = f.x;
      out[i + 1] = f.y;
    }
    if constexpr (E % 2 != 0) out[E - 1] = __half2float(__nv_cvt_fp8_to_halfraw(b[E - 1], kKind));
  } else {
    const T* e = reinterpret_cast<const T*>(w);
#pragma unroll
    for (int i = 0; i < E; ++i) out[i] = to_f(e[i]);
  }
}

}  // namespace pagedattn::detail::cuda
