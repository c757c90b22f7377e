// Split-kernel instantiations for f32 caches (CUDA cores: f32 stays exact).
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

bool launch_split_f32(const SplitParams& p, int head_dim, int grid, cudaStream_t stream) {
  return launch_split_for_dtype<float, false>(p, head_dim, SplitBuild{}, grid, stream);
}

int split_ctas_per_sm_f32(int head_dim) {
  return split_ctas_per_sm_for_dtype<float, false>(head_dim, SplitBuild{});
}

}  // namespace pagedattn::detail::cuda
