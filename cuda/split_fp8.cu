// Split-kernel instantiations for fp8 caches (e4m3 and e5m2): the tensor cores with an f16 or
// bf16 q at head dims that are multiples of 32 (fp8 tiles widened to f16 fragments,
// fp8_frags.cuh), the CUDA-core path otherwise (each code converted to f32 as a row is read).
// The scales are folded into the logit factor and the output. The tensor-core kernels at head
// dims 64 and 128 come in two builds (kDenseMinCtas in split_kernel.cuh).
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {

bool launch_split_fp8(const SplitParams& p, int head_dim, bool e5m2, SplitBuild b, int grid,
                      cudaStream_t stream) {
  return e5m2 ? launch_split_for_dtype<fp8_e5m2_t, true>(p, head_dim, b, grid, stream)
              : launch_split_for_dtype<fp8_e4m3_t, true>(p, head_dim, b, grid, stream);
}

int split_ctas_per_sm_fp8(int head_dim, bool e5m2, SplitBuild b) {
  return e5m2 ? split_ctas_per_sm_for_dtype<fp8_e5m2_t, true>(head_dim, b)
              : split_ctas_per_sm_for_dtype<fp8_e4m3_t, true>(head_dim, b);
}

}  // namespace pagedattn::detail::cuda
