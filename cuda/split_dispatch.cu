// The split kernel's entry points: the cache dtype and the head dim pick SplitKernels<T, D>, whose
// kernels are compiled in translation units of their own (split_instance.cu.in).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagedattn/dtype.hpp"
#include "split_params.cuh"
#if PAGEDATTN_MANY_ROWS_KERNEL
#include "hopper/many_rows.hpp"
#endif

namespace pagedattn::detail::cuda {
namespace {

template <typename T>
struct CacheType {
  using type = T;
};

// Calls f(CacheType<T>{}) for the split kernels' cache type T of k_dtype.
template <typename F>
void with_cache_type(DType k_dtype, F&& f) {
  switch (k_dtype) {
    case DType::kF32:
      return f(CacheType<float>{});
    case DType::kF16:
      return f(CacheType<__half>{});
    case DType::kBF16:
      return f(CacheType<__nv_bfloat16>{});
    case DType::kFP8E4M3:
      return f(CacheType<fp8_e4m3_t>{});
    case DType::kFP8E5M2:
      return f(CacheType<fp8_e5m2_t>{});
    case DType::kInt8:
      return f(CacheType<int8_code_t>{});
  }
}

}  // namespace

bool launch_split(const SplitParams& p, const GeneralVariant& var, DType k_dtype, int head_dim,
                  SplitBuild b, int grid, cudaStream_t stream) {
#if PAGEDATTN_MANY_ROWS_KERNEL
  if (b.hopper) return head_dim == 128 && launch_many_rows(p, var, k_dtype, grid, stream);
#endif
  bool launched = false;
  with_cache_type(k_dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    launched = with_head_dim(head_dim, [&](auto dim) {
      SplitKernels<T, decltype(dim)::value>::launch(p, var, b, grid, stream);
    });
  });
  return launched;
}

BuildFacts split_build_facts(DType k_dtype, int head_dim, SplitBuild b) {
  BuildFacts facts;
  if (b.hopper) {  // none without the kernel in this build
#if PAGEDATTN_MANY_ROWS_KERNEL
    if (head_dim == 128) facts = many_rows_facts(k_dtype);
#endif
    return facts;
  }
  with_cache_type(k_dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    with_head_dim(head_dim,
                  [&](auto dim) { facts = SplitKernels<T, decltype(dim)::value>::facts(b); });
  });
  return facts;
}

}  // namespace pagedattn::detail::cuda
