// Split-kernel instantiations for f16 caches: tensor-core MMA for groups >= 4, CUDA cores below.
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

template <int D>
static void launch_d(const SplitParams& p, bool mma, int grid, cudaStream_t stream) {
  if (mma) {
    launch_split_typed<__half, D, true>(p, grid, stream);
  } else {
    launch_split_typed<__half, D, false>(p, grid, stream);
  }
}

void launch_split_f16(const SplitParams& p, int head_dim, bool mma, int grid, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_d<64>(p, mma, grid, stream);
    case 80:
      return launch_d<80>(p, mma, grid, stream);
    case 96:
      return launch_d<96>(p, mma, grid, stream);
    case 112:
      return launch_d<112>(p, mma, grid, stream);
    case 128:
      return launch_d<128>(p, mma, grid, stream);
    case 192:
      return launch_d<192>(p, mma, grid, stream);
    case 256:
      return launch_d<256>(p, mma, grid, stream);
    default:
      return;  // rejected by validate_shapes before any launch
  }
}

}  // namespace pagedattn::detail::cuda
