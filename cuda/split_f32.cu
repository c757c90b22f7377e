// Split-kernel instantiations for f32 caches (CUDA cores: f32 stays exact).
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

void launch_split_f32(const SplitParams& p, int head_dim, int grid, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_split_typed<float, 64, false>(p, grid, stream);
    case 80:
      return launch_split_typed<float, 80, false>(p, grid, stream);
    case 96:
      return launch_split_typed<float, 96, false>(p, grid, stream);
    case 112:
      return launch_split_typed<float, 112, false>(p, grid, stream);
    case 128:
      return launch_split_typed<float, 128, false>(p, grid, stream);
    case 192:
      return launch_split_typed<float, 192, false>(p, grid, stream);
    case 256:
      return launch_split_typed<float, 256, false>(p, grid, stream);
    default:
      return;  // rejected by validate_shapes before any launch
  }
}

}  // namespace pagedattn::detail::cuda
