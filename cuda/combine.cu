// The library's combine (combine.cuh): the combine kernel (combine_kernel.cuh) with the variant
// policy every decode runs.
#include "combine_kernel.cuh"

namespace pagedattn::detail::cuda {

void launch_combine(const CombineParams& c, const GeneralVariant& var, DType out_dtype, bool pdl,
                    cudaStream_t stream) {
  launch_combine_with(c, var, out_dtype, pdl, stream);
}

bool combine_has_image() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, combine_detail::combine_kernel<float, GeneralVariant>) ==
         cudaSuccess;
}

int kernels_ptx_version() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, combine_detail::combine_kernel<float, GeneralVariant>) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return attr.ptxVersion;
}

}  // namespace pagedattn::detail::cuda
