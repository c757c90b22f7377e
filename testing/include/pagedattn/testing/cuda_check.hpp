// The one CUDA error check of the tests, the fuzzer, the benchmark and the simulator: a failed
// runtime call becomes a pagedattn::Error (kDeviceError) naming the call and the CUDA error. Only
// for code built with the CUDA runtime (.cu files, and tests guarded by
// PAGEDATTN_TESTS_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "pagedattn/error.hpp"

namespace pagedattn::testing {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(ErrorCode::kDeviceError, what, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

}  // namespace pagedattn::testing
