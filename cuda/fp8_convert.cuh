// Two fp8 codes to an f16 pair, exactly (f16 holds every e4m3 and e5m2 value). sm_89 and later
// convert in one instruction. Older GPUs run the CUDA runtime's software conversion, a long
// sequence that is kept out of line there: inlined at every fragment it made the fp8 kernels
// compile for minutes per head dim.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace pagedattn::detail::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
__device__ __noinline__ __half2_raw fp8x2_to_half2_soft(__nv_fp8x2_storage_t two,
                                                        __nv_fp8_interpretation_t kind) {
  return __nv_cvt_fp8x2_to_halfraw2(two, kind);
}
#endif

// Codes `two` (low byte first) as an f16 pair (low half first).
__device__ __forceinline__ __half2_raw fp8x2_to_half2(__nv_fp8x2_storage_t two,
                                                      __nv_fp8_interpretation_t kind) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  return fp8x2_to_half2_soft(two, kind);
#else
  return __nv_cvt_fp8x2_to_halfraw2(two, kind);
#endif
}

}  // namespace pagedattn::detail::cuda
