// The CUDA backend entry points.
#include <cuda_runtime.h>

#include "pagedattn/detail/backends.hpp"

namespace pagedattn::detail::cuda {

bool available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why) {
      *why = err != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(err)
                                : std::string("no CUDA device present");
    }
    return false;
  }
  return true;
}

void decode(const DecodeArgs&, const DecodeOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: the CUDA kernels are not implemented yet");
}

}  // namespace pagedattn::detail::cuda
