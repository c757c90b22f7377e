// The CUDA error check of the tests, the fuzzer, the benchmark and the simulator: the library's
// own (cuda/cuda_error.hpp), so a failed runtime call becomes the same pagedattn::Error
// (kDeviceError) naming the call and the CUDA error. Only for code built with the CUDA runtime
// (.cu files, and tests guarded by PAGEDATTN_TESTS_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "cuda_error.hpp"

namespace pagedattn::testing {

inline void check_cuda(cudaError_t err, const char* what) { detail::cuda::check(err, what); }

}  // namespace pagedattn::testing
