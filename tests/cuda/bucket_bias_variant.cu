// The bucket-bias variant (bucket_bias_variant.hpp): its policy, and a decode that runs the
// library's split kernel and combine with it. Nothing here edits or copies a kernel: the policy's
// hooks are all the kernels see of it.
#include <cuda_bf16.h>

#include "bucket_bias_variant.hpp"
#include "combine_kernel.cuh"
#include "decode_steps.hpp"
#include "pagedattn/testing/cuda_check.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "split_kernel.cuh"

namespace pagedattn::testing {
namespace {

struct BucketBiasPolicy {
  BucketBias v;

  struct Row {
    const float* bias;  // the row's head's buckets
  };
  __device__ __forceinline__ Row row(int head, bool /*valid*/) const {
    return {v.bias + head * kBiasBuckets};
  }
  __device__ __forceinline__ bool transforms_logits() const { return true; }
  __device__ __forceinline__ float logit(const Row& r, float x2, int rel) const {
    const int d = rel < 0 ? -rel : 0;
    const int bucket = d / kBucketTokens < kBiasBuckets ? d / kBucketTokens : kBiasBuckets - 1;
    return fmaf(__ldg(r.bias + bucket), kLog2e, x2);
  }
  __device__ __forceinline__ float finish(SoftmaxState2& st, int head) const {
    return add_sink(st, __ldg(v.null_logit + head) * kLog2e);
  }
};

}  // namespace

void decode_with_bucket_bias(const DecodeArgs& a, const BucketBias& v) {
  namespace cu = detail::cuda;
  if (a.k_dtype != DType::kBF16 || a.q_dtype != DType::kBF16 || a.head_dim != 128) {
    fail(ErrorCode::kUnsupported, "k_dtype", dtype_name(a.k_dtype),
         "the bucket-bias test variant is built for bf16 at head dim 128 only");
  }
  const detail::DecodeOptions options;
  const cu::RowUnits units = cu::can_implement(a, options);
  const cu::DecodePlan plan = cu::plan_decode(a, false);
  if (plan.kernel.build.hopper) {
    fail(ErrorCode::kUnsupported, "num_heads", a.num_heads,
         "the bucket-bias test variant is built on the split kernel, not the many-row one");
  }
  DeviceBuffer workspace(plan.workspace.total);
  const cu::SplitParams p = cu::make_split_params(a, plan, units, workspace.as<char>());
  const BucketBiasPolicy policy{v};
  if (plan.splits == 0) {
    check_cuda(cudaMemset(p.split_offset, 0, (a.batch + 1) * sizeof(int)), "cudaMemset");
  } else {
    const int grid = static_cast<int>(plan.splits * a.num_kv_heads * p.row_chunks);
    cu::launch_split_build<__nv_bfloat16, 128>(p, policy, plan.kernel.build, grid, nullptr);
    check_cuda(cudaGetLastError(), "split kernel launch");
  }
  cu::launch_combine_with(cu::make_combine_params(a, p), policy, a.out_dtype, false, nullptr);
  check_cuda(cudaDeviceSynchronize(), "bucket-bias decode");
}

}  // namespace pagedattn::testing
