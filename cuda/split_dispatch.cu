// The split kernel's entry points per cache dtype: the head dim picks SplitKernels<T, D>, whose
// kernels are compiled in translation units of their own (split_instance.cu.in).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagedattn/dtype.hpp"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {
namespace {

template <typename T>
bool launch_for_head_dim(const SplitParams& p, int head_dim, SplitBuild b, int grid,
                         cudaStream_t stream) {
  return with_head_dim(head_dim, [&](auto dim) {
    SplitKernels<T, decltype(dim)::value>::launch(p, b, grid, stream);
  });
}

template <typename T>
int ctas_per_sm_for_head_dim(int head_dim, SplitBuild b) {
  int n = 0;
  with_head_dim(head_dim,
                [&](auto dim) { n = SplitKernels<T, decltype(dim)::value>::ctas_per_sm(b); });
  return n;
}

}  // namespace

bool launch_split_f32(const SplitParams& p, int head_dim, int grid, cudaStream_t stream) {
  return launch_for_head_dim<float>(p, head_dim, SplitBuild{}, grid, stream);
}
bool launch_split_f16(const SplitParams& p, int head_dim, SplitBuild b, int grid,
                      cudaStream_t stream) {
  return launch_for_head_dim<__half>(p, head_dim, b, grid, stream);
}
bool launch_split_bf16(const SplitParams& p, int head_dim, SplitBuild b, int grid,
                       cudaStream_t stream) {
  return launch_for_head_dim<__nv_bfloat16>(p, head_dim, b, grid, stream);
}
bool launch_split_fp8(const SplitParams& p, int head_dim, bool e5m2, SplitBuild b, int grid,
                      cudaStream_t stream) {
  return e5m2 ? launch_for_head_dim<fp8_e5m2_t>(p, head_dim, b, grid, stream)
              : launch_for_head_dim<fp8_e4m3_t>(p, head_dim, b, grid, stream);
}

int split_ctas_per_sm_f32(int head_dim) {
  return ctas_per_sm_for_head_dim<float>(head_dim, SplitBuild{});
}
int split_ctas_per_sm_f16(int head_dim, SplitBuild b) {
  return ctas_per_sm_for_head_dim<__half>(head_dim, b);
}
int split_ctas_per_sm_bf16(int head_dim, SplitBuild b) {
  return ctas_per_sm_for_head_dim<__nv_bfloat16>(head_dim, b);
}
int split_ctas_per_sm_fp8(int head_dim, bool e5m2, SplitBuild b) {
  return e5m2 ? ctas_per_sm_for_head_dim<fp8_e5m2_t>(head_dim, b)
              : ctas_per_sm_for_head_dim<fp8_e4m3_t>(head_dim, b);
}

}  // namespace pagedattn::detail::cuda
