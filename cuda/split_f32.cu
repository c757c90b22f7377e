// Split-kernel instantiations for f32 caches (CUDA cores: f32 stays exact).
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

void launch_split_f32(const SplitParams& p, int head_dim, int grid, cudaStream_t stream) {
  launch_split_for_dtype<float, false>(p, head_dim, false, grid, stream);
}

}  // namespace pagedattn::detail::cuda
