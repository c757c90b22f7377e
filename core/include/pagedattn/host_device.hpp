// One macro lets every core header compile under g++ and nvcc alike.
#pragma once

#if defined(__CUDACC__)
#define PAGEDATTN_HOST_DEVICE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
// Always inlined on the host too: the CPU backend compiles these helpers into translation units
// built for different ISAs, and an out-of-line copy built for AVX-512 must never be the one the
// linker keeps for the others.
#define PAGEDATTN_HOST_DEVICE inline __attribute__((always_inline))
#else
#define PAGEDATTN_HOST_DEVICE inline
#endif
