// CUDA runtime errors as pagedattn::Error (ErrorCode::kDeviceError), naming the call.
#pragma once

#include <cuda_runtime.h>

#include "pagedattn/error.hpp"

namespace pagedattn::detail::cuda {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(ErrorCode::kDeviceError, what, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

}  // namespace pagedattn::detail::cuda
