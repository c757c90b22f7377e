// The simulator's device memory on the CUDA runtime.
#include <cuda_runtime.h>

#include "pagedattn/error.hpp"
#include "sim/device_memory.hpp"

namespace pagedattn::sim {
namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(ErrorCode::kDeviceError, what, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}
}  // namespace

bool device_memory_built() { return true; }

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void device_fill(void* dst, int byte, std::size_t bytes) {
  check(cudaMemset(dst, byte, bytes), "cudaMemset");
}

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace pagedattn::sim
