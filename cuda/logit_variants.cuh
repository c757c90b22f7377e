// The logit variants on the device (pagedattn/variants.hpp) in the kernels' log2 units: the
// soft-cap, then the ALiBi bias. Both compute paths call variant_logit on each logit of an
// attended token, after noting whether it was finite (a soft-capped Inf would look finite).
#pragma once

#include "pagedattn/variants.hpp"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

// Query head `head`'s ALiBi slope in log2 units; 0 without ALiBi or for a padding row (!valid).
__device__ __forceinline__ float alibi_slope2(const SplitParams& p, int head, bool valid) {
  return p.alibi != nullptr && valid ? __ldg(p.alibi + head) * kLog2e : 0.f;
}

// The logit x2 (log2 units) of a token rel = t - (L - 1) positions from the query.
__device__ __forceinline__ float variant_logit(const SplitParams& p, float x2, float slope2,
                                               int rel) {
  if (p.cap2 > 0.f) x2 = soft_cap_log2(x2, p.cap2, p.cap_k);
  return fmaf(slope2, static_cast<float>(rel), x2);
}

// The sink of query head `head` folded into its finished state (pagedattn::add_sink): returns
// the factor for the accumulator, 1 without sinks.
__device__ __forceinline__ float fold_sink(const SplitParams& p, SoftmaxState2& st, int head) {
  return p.sinks != nullptr ? add_sink(st, __ldg(p.sinks + head) * kLog2e) : 1.f;
}

}  // namespace pagedattn::detail::cuda
