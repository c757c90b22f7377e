// Split-kernel instantiations for fp8 caches (e4m3 and e5m2, any q and out dtype): the CUDA-core
// path, which converts each code to f32 as it reads a row; the scales are folded into the logit
// scale and the output (simt_path.cuh).
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

bool launch_split_fp8(const SplitParams& p, int head_dim, bool e5m2, int grid,
                      cudaStream_t stream) {
  return e5m2 ? launch_split_for_dtype<fp8_e5m2_t, false>(p, head_dim, false, grid, stream)
              : launch_split_for_dtype<fp8_e4m3_t, false>(p, head_dim, false, grid, stream);
}

int split_ctas_per_sm_fp8(int head_dim, bool e5m2) {
  return e5m2 ? split_ctas_per_sm_for_dtype<fp8_e5m2_t, false>(head_dim, false)
              : split_ctas_per_sm_for_dtype<fp8_e4m3_t, false>(head_dim, false);
}

}  // namespace pagedattn::detail::cuda
