// Variant policies: what a kernel adds to plain attention, as a type the kernels take as a
// template parameter (split_kernel, combine_kernel, the many-row kernel). The kernels call its
// hooks at fixed points and nowhere else, so a variant is added by writing a policy, with no
// edit to any kernel (tests/cuda/bucket_bias_variant.cu adds one that way). A policy is a
// trivially copyable value (a kernel argument) with:
//
//   struct Row;                                   what a query row keeps for the whole item
//   Row row(int head, bool valid) const;          a query row's constants (!valid: a padding row)
//   bool transforms_logits() const;               uniform: whether logit() can change a logit;
//                                                 when false the kernels skip it, and keep the
//                                                 logits unscaled until the exponentials
//   float logit(const Row&, float x2, int rel) const;
//                                                 the logit x2 (log2 units, scaled) of a token
//                                                 rel = t - (L - 1) + back positions from the
//                                                 row's query (rel <= 0 for attended tokens)
//   float finish(SoftmaxState2& st, int head) const;
//                                                 once per finished row, by whichever kernel
//                                                 finishes it (the split CTA of a one-split
//                                                 sequence or the combine): folds what joins the
//                                                 softmax's denominator into st and returns the
//                                                 factor for the accumulator
//
// Which tokens a row attends to (the causal rule among a sequence's query tokens and the window)
// is the plan's (query_rows.cuh), since the planner skips the blocks no row attends to.
#pragma once

#include "pagedattn/online_softmax.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::detail::cuda {

// The variants of DecodeArgs (pagedattn/variants.hpp) from runtime values, in the kernels' log2
// units: the soft-cap, then the ALiBi bias, on each logit; the sink in the finish. Every decode
// runs this policy (one instantiation per kernel build); with none of them set it costs one
// uniform branch per slice.
struct GeneralVariant {
  float cap2 = 0.f;              // soft-cap * log2(e), 0: none
  float cap_k = 0.f;             // soft_cap_exp2_scale(cap2)
  const float* alibi = nullptr;  // f32 [num_heads] ALiBi slopes, natural-log units, or null
  const float* sinks = nullptr;  // f32 [num_heads] sinks, natural-log units, or null
  bool transforms = false;       // a soft-cap or ALiBi slopes

  struct Row {
    float slope2;  // the row's ALiBi slope in log2 units; 0 without ALiBi or for a padding row
  };
  __device__ __forceinline__ Row row(int head, bool valid) const {
    return {alibi != nullptr && valid ? __ldg(alibi + head) * kLog2e : 0.f};
  }
  __device__ __forceinline__ bool transforms_logits() const { return transforms; }
  __device__ __forceinline__ float logit(const Row& r, float x2, int rel) const {
    if (cap2 > 0.f) x2 = soft_cap_log2(x2, cap2, cap_k);
    return fmaf(r.slope2, static_cast<float>(rel), x2);
  }
  // The sink (pagedattn::add_sink): the denominator only.
  __device__ __forceinline__ float finish(SoftmaxState2& st, int head) const {
    return sinks != nullptr ? add_sink(st, __ldg(sinks + head) * kLog2e) : 1.f;
  }
};

}  // namespace pagedattn::detail::cuda
