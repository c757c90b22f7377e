// Random inputs on the device for the benchmarks: a counter hash, so any element's value is a
// function of (seed, index) alone (reproducible, the same on every GPU, never zeros).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace pagedattn::bench {

__device__ __forceinline__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

// Approximately N(0, 1): Box-Muller over two hashed uniforms.
__device__ __forceinline__ float hashed_normal(std::uint64_t seed, std::uint64_t i) {
  const float u1 = (hash32(seed * 0x9e3779b97f4a7c15ull + 2 * i) + 1.f) * 2.3283064e-10f;
  const float u2 = hash32(seed * 0x9e3779b97f4a7c15ull + 2 * i + 1) * 2.3283064e-10f;
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace pagedattn::bench
