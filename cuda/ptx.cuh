// Thin wrappers over the PTX the kernels use: shared-memory addresses, cp.async, warp
// reductions, ldmatrix and the m16n8k16 tensor-core MMA for f16/bf16. sm_80 and newer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace pagedattn::detail::cuda {

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy of a tile row's chunk; a negative `row` (the row's index, -1 when it must
// not be read) reads nothing and zero-fills the destination (the ignore-src predicate: one
// predicated instruction, where a computed src-size costs several; the predicate is one compare
// of the index itself).
__device__ __forceinline__ void cp_async16_row(void* dst, const void* src, int row) {
  asm volatile(
      "{\n .reg .pred skip;\n setp.lt.s32 skip, %2, 0;\n"
      " cp.async.cg.shared.global [%0], [%1], 16, skip;\n}\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(row));
}
// 4-byte async copy (a float) with the same predicate: a negative `row` zero-fills dst.
__device__ __forceinline__ void cp_async4_row(void* dst, const void* src, int row) {
  asm volatile(
      "{\n .reg .pred skip;\n setp.lt.s32 skip, %2, 0;\n"
      " cp.async.ca.shared.global [%0], [%1], 4, skip;\n}\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(row));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// query heads as the M rows (padded to 16), 16-token slices as N (scores) and K (P V). P is
// split into hi + lo parts of the storage type, so the P V product keeps f32-level accuracy.

// The m16n8k16 MMA of 16-bit type T (__half or __nv_bfloat16) with f32 accumulators, and the
// packing of its fragments: two values of T in one 32-bit register, the first in the low half.
template <typename T>
struct MmaOp {
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(kBf16 || std::is_same_v<T, __half>, "MmaOp: f16 or bf16");
  using Pair = std::conditional_t<kBf16, __nv_bfloat162, __half2>;
  // Of one 16-bit value: the exponent field, and 1.0.
  static constexpr std::uint32_t kExpMask = kBf16 ? 0x7f80u : 0x7c00u;
  static constexpr std::uint32_t kOne = kBf16 ? 0x3f80u : 0x3c00u;
  static __device__ __forceinline__ std::uint32_t pack(float a, float b) {
    Pair h;
    if constexpr (kBf16) {
      h = __floats2bfloat162_rn(a, b);
    } else {
      h = __floats2half2_rn(a, b);
    }
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ void unpack(std::uint32_t u, float& a, float& b) {
    Pair h = *reinterpret_cast<Pair*>(&u);
    a = __low2float(h);
    b = __high2float(h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
#define PAGEDATTN_MMA_M16N8K16(TYPE)                     \
  "mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE \
  ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "                  \
  "{%8,%9}, {%0,%1,%2,%3};\n"
    if constexpr (kBf16) {
      asm volatile(PAGEDATTN_MMA_M16N8K16("bf16")
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(PAGEDATTN_MMA_M16N8K16("f16")
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#undef PAGEDATTN_MMA_M16N8K16
  }
};

// Zeroes the non-finite values of a pair of 16-bit floats of Op's type in x and returns the
// pair's indicator: 1 where a value was not finite, else 0.
template <class Op>
__device__ __forceinline__ std::uint32_t take_non_finite(std::uint32_t& x) {
  std::uint32_t ind = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::uint32_t m = Op::kExpMask << (16 * h);
    if ((x & m) == m) {
      x &= ~(0xffffu << (16 * h));
      ind |= Op::kOne << (16 * h);
    }
  }
  return ind;
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
}  // namespace pagedattn::detail::cuda
