// A variant that exists only in the tests, added to the CUDA kernels by writing its policy
// (bucket_bias_variant.cu) with no edit to any kernel: a learned bias per query head and distance
// bucket on each logit (as T5's relative position bias), and a learned "null key" logit per head
// that joins every softmax's denominator. Plain C++ so the GoogleTest file needs no nvcc.
#pragma once

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::testing {

// Distance d = (the query's position) - t >= 0 falls in bucket min(d / kBucketTokens,
// kBuckets - 1).
constexpr int kBiasBuckets = 8;
constexpr int kBucketTokens = 37;

struct BucketBias {
  const float* bias = nullptr;        // device f32 [num_heads][kBiasBuckets], natural-log units
  const float* null_logit = nullptr;  // device f32 [num_heads], natural-log units
};

// Decodes `a` (device buffers; bf16 q and cache, head dim 128, on the split kernel: not the
// many-row one) with the bucket-bias variant on the default stream and waits. Throws what decode
// would for arguments it refuses.
void decode_with_bucket_bias(const DecodeArgs& a, const BucketBias& v);

}  // namespace pagedattn::testing
