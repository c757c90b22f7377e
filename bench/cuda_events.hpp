// A pair of CUDA events for timing an interval on a stream, created and destroyed with the
// object (the benchmarks' .cu files only).
#pragma once

#include <cuda_runtime.h>

#include "pagedattn/testing/cuda_check.hpp"

namespace pagedattn::bench {

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    testing::check_cuda(cudaEventCreate(&a), "cudaEventCreate");
    testing::check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

}  // namespace pagedattn::bench
