// 8-bit cache tiles (fp8 and int8 codes) as tensor-core operands (mma_path.cuh). The tiles stay
// 8-bit in shared memory, half the bytes of a 16-bit tile, and each fragment is widened in
// registers to f16, which holds every e4m3, e5m2 and int8 value exactly: the MMAs are m16n8k16 in
// f16 whatever q's dtype.
//
// ldmatrix moves 16-bit elements, so on fp8 rows it hands each lane four codes where a 16-bit
// tile would hand it two elements; the fragments below take them in an order the MMA does not
// care about, and the other operand follows it:
//  - K (S = Q K^T, non-transposed ldmatrix of 8 tokens x 16 codes): lane (g, q4) gets token g's
//    codes 4 q4 .. 4 q4 + 3. Codes 4 q4, 4 q4 + 1 become the B register of k 2 q4, 2 q4 + 1 and
//    codes 4 q4 + 2, + 3 that of k 2 q4 + 8, + 9: k-step kk runs over the head dims in the order
//    16 kk + {0, 1, 4, 5, ..., 12, 13, 2, 3, 6, 7, ..., 14, 15}, and q's A fragments are loaded
//    in that order (fp8_q_fragments).
//  - V (O += P V, transposed ldmatrix): lane (g, q4) gets dims 2 g and 2 g + 1 of tokens 2 q4 and
//    2 q4 + 1 (bytes: token a dim 2g, a 2g+1, b 2g, b 2g+1). Bytes 0 and 2 are the B register of
//    output column g for dim 2 g, bytes 1 and 3 for dim 2 g + 1: each 16-code chunk feeds two
//    n-tiles of 8 columns, one of its even dims and one of its odd dims (fp8_chunk_dim).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "fp8_convert.cuh"
#include "pagedattn/dtype.hpp"
#include "query_rows.cuh"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

// Codes `a` (low half) and `b` (high half) of word x as an f16 pair. e5m2 is the top byte of an
// f16, so a byte permute is the whole conversion; e4m3 goes through the sm_89 conversion (exact).
// An int8 code c, biased to c + 128 (its sign bit flipped), is the low byte of the f16 0x64xx,
// which is 1024 + c + 128 exactly (f16's step is 1 in [1024, 2048)): less 1152, it is c.
template <typename T, int a, int b>
__device__ __forceinline__ std::uint32_t fp8_pair(std::uint32_t x) {
  if constexpr (std::is_same_v<T, int8_code_t>) {
    const std::uint32_t biased =
        __byte_perm(x ^ 0x80808080u, 0x64646464u, (4 << 12) | (b << 8) | (4 << 4) | a);
    std::uint32_t h;
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(h) : "r"(biased), "r"(0x64806480u));  // 1152 in f16
    return h;
  } else if constexpr (std::is_same_v<T, fp8_e5m2_t>) {
    return __byte_perm(x, 0u, (b << 12) | (4 << 8) | (a << 4) | 4);
  } else {
    const std::uint32_t two = (a == 0 && b == 1)
                                  ? (x & 0xffffu)
                                  : (a == 2 && b == 3 ? x >> 16 : __byte_perm(x, 0u, (b << 4) | a));
    const __half2_raw h = fp8x2_to_half2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
    return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
  }
}

// The B registers of a K fragment word (see above): k 2 q4, 2 q4 + 1 and k 2 q4 + 8, + 9.
template <typename T>
__device__ __forceinline__ void fp8_k_regs(std::uint32_t x, std::uint32_t& b0, std::uint32_t& b1) {
  b0 = fp8_pair<T, 0, 1>(x);
  b1 = fp8_pair<T, 2, 3>(x);
}
// The B registers of a transposed V word: dim 2 g (bytes 0, 2) and dim 2 g + 1 (bytes 1, 3).
template <typename T>
__device__ __forceinline__ void fp8_v_regs(std::uint32_t x, std::uint32_t& even,
                                           std::uint32_t& odd) {
  even = fp8_pair<T, 0, 2>(x);
  odd = fp8_pair<T, 1, 3>(x);
}

// The accumulator columns of lane quad q4 for 16-code chunk c in the fp8 path: n-tile 2 c holds
// the chunk's even dims, 2 c + 1 its odd ones, so the lane's column pair (element e = 0, 1) of
// n-tile 2 c + h is dim 16 c + 4 q4 + h + 2 e. Returns the first of those four dims,
// 16 c + 4 q4: n-tile 2 c's pair goes to it and + 2, n-tile 2 c + 1's to + 1 and + 3.
__device__ __forceinline__ int fp8_chunk_dim(int c, int q4) { return 16 * c + 4 * q4; }

// q's A fragments for the fp8 path, in f16 with K's k order (above): k-step kk's a0 / a1 are
// elements 16 kk + 4 q4 + {0, 1} of rows g / g + 8, a2 / a3 elements + {2, 3}. An f16 q goes in
// as it is. A bf16 q is exact in f16 once scaled by a power of two: each row is scaled so its
// largest magnitude lies in [2^14, 2^15) (bf16's 8 significant bits fit f16's 11; only elements
// 2^24 below the row's largest lose bits, as f16 subnormals, far below the f32 rounding of the
// dot product). fac[r] gets the row's logit factor: scale_log2 x the K scale / that power.
// put(kk, a) receives each k-step's fragment.
template <int D, class Put>
__device__ __forceinline__ void fp8_q_fragments(const SplitParams& p, const QueryRow (&qr)[2],
                                                int q4, float k_scale, float (&fac)[2], Put&& put) {
  const bool bf16 = p.q_dtype == static_cast<int>(DType::kBF16);
  const char* rowp[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rowp[r] = static_cast<const char*>(p.q) +
              (qr[r].qrow * p.q_stride + static_cast<std::int64_t>(qr[r].head) * D) * 2 + 8 * q4;
  }
  auto load = [&](int r, int kk) {
    return qr[r].valid ? *reinterpret_cast<const uint2*>(rowp[r] + kk * 32) : make_uint2(0, 0);
  };
  // Each row's scale as two powers of two (2^14-e can exceed f32's range on its own).
  float s1[2] = {1.f, 1.f}, s2[2] = {1.f, 1.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    fac[r] = p.scale_log2 * k_scale;
    if (!bf16) continue;
    float mx = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint2 w = load(r, kk);
      const std::uint32_t m =
          max(max(w.x & 0x7fffu, w.x >> 16 & 0x7fffu), max(w.y & 0x7fffu, w.y >> 16 & 0x7fffu));
      mx = fmaxf(mx, __uint_as_float(m << 16));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const int biased = static_cast<int>(__float_as_uint(mx) >> 23);
    // Zero and non-finite rows stay unscaled (non-finite values flag the row anyway); a row of
    // subnormals counts as exponent -127.
    if (mx == 0.f || biased == 255) continue;
    const int sh = 14 - (max(biased, 1) - 127);  // in [-113, 140]
    const int h1 = sh / 2, h2 = sh - h1;
    s1[r] = __uint_as_float(static_cast<std::uint32_t>(127 + h1) << 23);
    s2[r] = __uint_as_float(static_cast<std::uint32_t>(127 + h2) << 23);
    fac[r] = fac[r] * __uint_as_float(static_cast<std::uint32_t>(127 - h1) << 23) *
             __uint_as_float(static_cast<std::uint32_t>(127 - h2) << 23);
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint2 w = load(r, kk);
      if (bf16) {
        auto cvt = [&](std::uint32_t x) {
          const float lo = __uint_as_float(x << 16) * s1[r] * s2[r];
          const float hi = __uint_as_float(x & 0xffff0000u) * s1[r] * s2[r];
          const __half2 h = __floats2half2_rn(lo, hi);
          return *reinterpret_cast<const std::uint32_t*>(&h);
        };
        a[r] = cvt(w.x);
        a[r + 2] = cvt(w.y);
      } else {
        a[r] = w.x;
        a[r + 2] = w.y;
      }
    }
    put(kk, a);
  }
}

}  // namespace pagedattn::detail::cuda
