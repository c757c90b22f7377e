// Split-kernel instantiations for f16 caches: tensor-core MMA for groups >= 4, CUDA cores below.
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

void launch_split_f16(const SplitParams& p, int head_dim, bool mma, int grid, cudaStream_t stream) {
  launch_split_for_dtype<__half, true>(p, head_dim, mma, grid, stream);
}

}  // namespace pagedattn::detail::cuda
