// Kernel launches of the decode steps: each may start as a programmatic dependent of the kernel
// before it on the stream (griddepcontrol; DeviceInfo::pdl), and waits inside for its results.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace pagedattn::detail::cuda {

// Enqueues kernel<<<grid, threads, smem_bytes, stream>>>(args...), as a programmatic dependent
// launch where `pdl` is set. Returns the launch's error for the caller to check.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), int grid, int threads, int smem_bytes,
                          bool pdl, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace pagedattn::detail::cuda
