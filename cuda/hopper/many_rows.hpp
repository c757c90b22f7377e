// The Hopper many-row kernel's host side (many_rows.cu, compiled for sm_90a alone, and only
// where the build's CUDA architectures include sm_90): f16 and bf16 caches with q in the cache
// dtype at head dim 128, block sizes 16 to 256 in powers of two. The split kernel's plan,
// parameters, partial states and combine serve it unchanged (SplitBuild::hopper).
#pragma once

#include <cuda_runtime.h>

#include "../split_params.cuh"
#include "../variant_policy.cuh"
#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cuda {

// What the current device offers of the kernel for cache dtype k_dtype: none (0 CTAs) on a
// device other than compute capability 9.0, or in a build without sm_90.
BuildFacts many_rows_facts(DType k_dtype);

// Enqueues the kernel over `grid` CTAs; false when this build has none for k_dtype. The cache
// is read through TMA tensor maps built here from the parameters' layout; a layout TMA cannot
// describe is an error naming the cache strides. The kernel runs the variant policy's hooks as
// the split kernel does.
bool launch_many_rows(const SplitParams& p, const GeneralVariant& var, DType k_dtype, int grid,
                      cudaStream_t stream);

}  // namespace pagedattn::detail::cuda
