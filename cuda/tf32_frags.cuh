// f32 caches on the tensor cores (mma_path.cuh): mma.sync m16n8k8 in tf32, each f32 operand x
// split into a tf32 hi part and the rest, lo = x - hi, and a product a b taken as three MMAs,
// a_lo b_hi + a_hi b_lo + a_hi b_hi (3xTF32; the small terms first, so they add before the large
// one rounds them away). hi is x rounded to tf32 (11 significant bits), so |x - hi| <= 2^-11 |x|;
// the MMA reads lo at tf32 precision too, leaving |x - hi - lo'| <= 2^-22 |x|, and the dropped
// a_lo b_lo is at most 2^-22 |a b|. Each product is then within about 3 x 2^-22 of a b, near f32's
// own rounding (2^-24). The tensor cores' f32 sums do not round to nearest, so no accumulator
// takes more than one slice of MMAs: S is one slice's, and P V's slice is added to the item's
// accumulator with f32 adds (tf32_values). The tests hold this path to the f32 tolerance
// against the f64 reference (docs/cuda.md has the bound and the measured error).
//
// The fragments, for lane (g, q4):
//  - Q (A of S = Q K^T, k-step kk over head dims 8 kk .. 8 kk + 7): a0 / a1 dim 8 kk + q4 of rows
//    g / g + 8, a2 / a3 dim 8 kk + q4 + 4. Split once per item and kept in shared memory.
//  - K (B): ldmatrix on 32-bit elements hands lane (g, q4) element q4 of row g's 16-byte chunk,
//    which is b0 for chunk 2 kk and b1 for chunk 2 kk + 1: the 16-bit path's addressing as it is.
//  - P (A of O += P V, k-step n over the slice's tokens 8 n .. 8 n + 7): the score fragment holds
//    tokens 2 q4 and 2 q4 + 1 of each n-tile, so the k order is permuted: k q4 is token 2 q4 and
//    k q4 + 4 is token 2 q4 + 1, and a0..a3 are s[n][0], s[n][2], s[n][1], s[n][3].
//  - V (B): b0 / b1 are tokens 2 q4 / 2 q4 + 1 of column g. The columns are permuted too: column
//    g of n-tiles 2 m and 2 m + 1 is dims 16 m + 2 g and 16 m + 2 g + 1, so one 8-byte load per
//    token feeds both n-tiles. The accumulator's lane then holds dims 16 m + 4 q4 .. + 3, n-tile
//    2 m at + 0 and + 2, 2 m + 1 at + 1 and + 3: the fp8 path's order (fp8_chunk_dim).
#pragma once

#include <cstdint>

#include "kv_pipeline.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

// Head dims with a tf32 kernel: rows of whole 128-byte segments (the swizzled layout that the
// K ldmatrix and the V pair loads read without bank conflicts), and few enough accumulators.
template <int D>
constexpr bool kTf32HeadDim = D % 32 == 0 && D <= 128;

// x rounded to tf32 (nearest, ties away), as an f32 bit pattern.
__device__ __forceinline__ std::uint32_t tf32_round(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// An f32 operand as the hi and lo parts of 3xTF32. Non-finite x gives a non-finite part (an
// infinity's lo is inf - inf = NaN), so a non-finite value still makes its products NaN.
struct Tf32Pair {
  std::uint32_t hi, lo;
};
__device__ __forceinline__ Tf32Pair tf32_split(float x) {
  const std::uint32_t hi = tf32_round(x);
  return {hi, __float_as_uint(x - __uint_as_float(hi))};
}

// c += a b over one m16n8k8 tile in tf32.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An A fragment split into its parts.
struct Tf32A {
  std::uint32_t hi[4], lo[4];
};
__device__ __forceinline__ Tf32A tf32_a(float a0, float a1, float a2, float a3) {
  const float v[4] = {a0, a1, a2, a3};
  Tf32A a;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const Tf32Pair s = tf32_split(v[r]);
    a.hi[r] = s.hi;
    a.lo[r] = s.lo;
  }
  return a;
}

// c += a b in 3xTF32, b given as f32 bit patterns (b0, b1).
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const Tf32A& a, std::uint32_t b0,
                                           std::uint32_t b1) {
  const Tf32Pair x = tf32_split(__uint_as_float(b0)), y = tf32_split(__uint_as_float(b1));
  mma_tf32(c, a.lo, x.hi, y.hi);
  mma_tf32(c, a.hi, x.lo, y.lo);
  mma_tf32(c, a.hi, x.hi, y.hi);
}

// Where k-step kk of row tile wh keeps the lane's split Q fragment in shared memory: 16 bytes of
// hi, then 16 of lo.
template <int D, class Byte>
__device__ __forceinline__ Byte* tf32_q_at(Byte* sQ, int wh, int lane, int kk) {
  return sQ + ((wh * (D / 8) + kk) * 32 + lane) * 32;
}
template <int D>
constexpr int kTf32QBytesPerRowTile = D / 8 * 32 * 32;

// The lane's Q fragments of rows qr (g and g + 8 of row tile wh), split, into shared memory.
template <int D>
__device__ __forceinline__ void tf32_store_q(const float* q, std::int64_t q_stride,
                                             const QueryRow (&qr)[2], int wh, int lane, int q4,
                                             char* sQ) {
  const float* row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row[r] = q + qr[r].qrow * q_stride + std::int64_t{qr[r].head} * D;
  for (int kk = 0; kk < D / 8; ++kk) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e & 1, col = 8 * kk + q4 + (e >> 1) * 4;
      v[e] = qr[r].valid ? row[r][col] : 0.f;
    }
    const Tf32A a = tf32_a(v[0], v[1], v[2], v[3]);
    char* at = tf32_q_at<D>(sQ, wh, lane, kk);
    *reinterpret_cast<uint4*>(at) = make_uint4(a.hi[0], a.hi[1], a.hi[2], a.hi[3]);
    *reinterpret_cast<uint4*>(at + 16) = make_uint4(a.lo[0], a.lo[1], a.lo[2], a.lo[3]);
  }
}

template <int D>
__device__ __forceinline__ Tf32A tf32_load_q(const char* sQ, int wh, int lane, int kk) {
  const char* at = tf32_q_at<D>(sQ, wh, lane, kk);
  const uint4 h = *reinterpret_cast<const uint4*>(at);
  const uint4 l = *reinterpret_cast<const uint4*>(at + 16);
  return {{h.x, h.y, h.z, h.w}, {l.x, l.y, l.z, l.w}};
}

// P of k-step n (tokens 8 n .. 8 n + 7 of a slice) as the A fragment, in the permuted k order.
__device__ __forceinline__ Tf32A tf32_p(const float (&s)[2][4], int n) {
  return tf32_a(s[n][0], s[n][2], s[n][1], s[n][3]);
}

// The lane's V offsets within a slice, for tf32_values: v_at[2 t + h] is token 2 q4 + t, dims
// 16 h + 2 g and + 1; dims 16 m + 2 g add (m / 2) x 128 bytes to v_at[2 t + m % 2] (the swizzle
// permutes chunks only within a 128-byte segment, and k-step n's 8 rows keep each row's r & 7).
template <int D>
__device__ __forceinline__ void tf32_v_offsets(int g, int q4, int (&v_at)[4]) {
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      v_at[2 * t + h] = RowGeom<float, D>::offset(2 * q4 + t, 4 * h + (g >> 1)) + (g & 1) * 8;
    }
  }
}

}  // namespace pagedattn::detail::cuda
