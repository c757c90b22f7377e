// Device memory on the CUDA runtime.
#include <cuda_runtime.h>

#include "pagedattn/testing/cuda_check.hpp"
#include "pagedattn/testing/device_memory.hpp"

namespace pagedattn::testing {

bool device_memory_built() { return true; }

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void device_fill(void* dst, int byte, std::size_t bytes) {
  check_cuda(cudaMemset(dst, byte, bytes), "cudaMemset");
}

void device_synchronize() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace pagedattn::testing
