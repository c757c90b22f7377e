// The CUDA error check of the tests, the fuzzer, the benchmark and the simulator: the library's
// own (pagedattn/detail/cuda_status.hpp), so a failed runtime call becomes the same
// pagedattn::Error (kDeviceError) naming the call and the CUDA error. Only for code built with
// the CUDA runtime (.cu files, and tests guarded by PAGEDATTN_TESTS_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "pagedattn/detail/cuda_status.hpp"

namespace pagedattn::testing {

inline void check_cuda(cudaError_t err, const char* what) {
  detail::check_cuda_status(static_cast<int>(err), what);
}

}  // namespace pagedattn::testing
