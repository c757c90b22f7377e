// Split-kernel instantiations for bf16 caches: tensor-core MMA when q is in the cache dtype,
// CUDA cores otherwise.
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

bool launch_split_bf16(const SplitParams& p, int head_dim, SplitBuild b, int grid,
                       cudaStream_t stream) {
  return launch_split_for_dtype<__nv_bfloat16, true>(p, head_dim, b, grid, stream);
}

int split_ctas_per_sm_bf16(int head_dim, SplitBuild b) {
  return split_ctas_per_sm_for_dtype<__nv_bfloat16, true>(head_dim, b);
}

}  // namespace pagedattn::detail::cuda
