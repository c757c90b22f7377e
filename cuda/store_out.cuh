// Writing finished rows: out = acc / l in the output dtype (f32, f16 or bf16, round to nearest
// even) and lse. Used by the combine and by split CTAs that finish a single-split sequence
// themselves.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cuda {

template <typename OutT>
__device__ __forceinline__ void store_out(void* out, std::int64_t i, float v);
template <>
__device__ __forceinline__ void store_out<float>(void* out, std::int64_t i, float v) {
  static_cast<float*>(out)[i] = v;
}
template <>
__device__ __forceinline__ void store_out<__half>(void* out, std::int64_t i, float v) {
  static_cast<__half*>(out)[i] = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void store_out<__nv_bfloat16>(void* out, std::int64_t i, float v) {
  static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
}

// The output dtype known only at run time (uniform across the CTA, so the branch is free).
__device__ __forceinline__ void store_out(void* out, int dtype, std::int64_t i, float v) {
  if (dtype == static_cast<int>(DType::kF32)) {
    store_out<float>(out, i, v);
  } else if (dtype == static_cast<int>(DType::kF16)) {
    store_out<__half>(out, i, v);
  } else {
    store_out<__nv_bfloat16>(out, i, v);
  }
}

// Elements i and i + 1 (i even, so the pair is one aligned 4- or 8-byte store).
__device__ __forceinline__ void store_out_pair(void* out, int dtype, std::int64_t i, float a,
                                               float b) {
  if (dtype == static_cast<int>(DType::kF32)) {
    *reinterpret_cast<float2*>(static_cast<float*>(out) + i) = make_float2(a, b);
  } else if (dtype == static_cast<int>(DType::kF16)) {
    *reinterpret_cast<__half2*>(static_cast<__half*>(out) + i) = __floats2half2_rn(a, b);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + i) =
        __floats2bfloat162_rn(a, b);
  }
}

}  // namespace pagedattn::detail::cuda
