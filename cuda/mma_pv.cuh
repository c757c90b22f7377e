// The P V step of the tensor-core path (mma_path.cuh): O += P V for a warp's 16-token slices, the
// weights' score fragment reused in registers as the A operand and V's rows through
// ldmatrix.trans as the B operand (f32 caches: 3xTF32, V's rows by 8-byte loads, tf32_frags.cuh).
#pragma once

#include <cstdint>

#include "fp8_frags.cuh"
#include "mma_layout.cuh"
#include "ptx.cuh"
#include "tf32_frags.cuh"

namespace pagedattn::detail::cuda {

// Calls f(n, b) for a slice's V fragments two n-tiles at a time: b[0], b[1] the B registers of
// n-tile n (tokens 0-7, 8-15), b[2], b[3] those of n-tile n + 1. 16-bit tiles: n-tiles 2 dp,
// 2 dp + 1 are dims 16 dp .. 16 dp + 15. 8-bit tiles: an ldmatrix covers chunks 2 j and 2 j + 1,
// each giving the n-tiles of its even and odd dims.
template <typename T, int D, class F>
__device__ __forceinline__ void for_v_tiles(const char* v_slice, const int (&v_at)[4], F&& f) {
  if constexpr (MmaCfg<T, D>::kCodes) {
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {
      std::uint32_t raw[4];  // chunk 2 j: tokens 0-7, 8-15; chunk 2 j + 1: the same
      ldmatrix_x4_trans(raw, v_slice + v_at[j % 4] + (j / 4) * 128);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        std::uint32_t b[4];
        fp8_v_regs<T>(raw[2 * h], b[0], b[2]);
        fp8_v_regs<T>(raw[2 * h + 1], b[1], b[3]);
        f(4 * j + 2 * h, b);
      }
    }
  } else {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_slice + v_at[dp % 4] + (dp / 4) * 128);
      f(2 * dp, b);
    }
  }
}

// Zeroes a non-finite f32 (a bit pattern) and returns its indicator: 1.0f where it was not
// finite, else 0.
__device__ __forceinline__ std::uint32_t take_non_finite_f32(std::uint32_t& x) {
  if ((x & 0x7f800000u) != 0x7f800000u) return 0u;
  x = 0u;
  return 0x3f800000u;
}

// O += P V in 3xTF32 for the slice at v_slice (s: its weights; v_at: tf32_v_offsets), two
// k-steps of 8 tokens, each with one 8-byte load per token and pair of n-tiles
// (tf32_frags.cuh). disagree, keep: as for mma16_values. The slice's products go to a fresh
// accumulator, added to o by f32 adds: the tensor cores' own sums do not round to nearest, and
// over the thousands of tokens of a long split their error grew past f32's tolerance, while a
// slice's six MMAs stay far below it.
template <int D>
__device__ __forceinline__ void tf32_values(const int (&v_at)[4], const char* v_slice,
                                            const float (&s)[2][4], bool disagree, unsigned keep,
                                            float (&o_total)[D / 8][4]) {
  constexpr int ROW = RowGeom<float, D>::kRowBytes;
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const Tf32A a = tf32_p(s, n);
    const char* vn = v_slice + 8 * n * ROW;
    // The indicator operand of the rows that attend to each token (the permuted k order).
    std::uint32_t att[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int e = (r >> 1) | ((r & 1) << 1);  // a0..a3 are elements 0, 2, 1, 3
      att[r] = (keep >> (n * 4 + e)) & 1u ? 0x3f800000u : 0u;
    }
#pragma unroll
    for (int m = 0; m < D / 16; ++m) {
      const uint2 x0 = *reinterpret_cast<const uint2*>(vn + v_at[m & 1] + (m >> 1) * 128);
      const uint2 x1 = *reinterpret_cast<const uint2*>(vn + v_at[2 + (m & 1)] + (m >> 1) * 128);
      std::uint32_t b[4] = {x0.x, x1.x, x0.y, x1.y};  // n-tile 2 m: b[0], b[1]; 2 m + 1: b[2], b[3]
      if (!disagree) {
        mma_3xtf32(o[2 * m], a, b[0], b[1]);
        mma_3xtf32(o[2 * m + 1], a, b[2], b[3]);
        continue;
      }
      // As in mma16_values: V's non-finite values go in as 0, and the indicator product makes the
      // columns of the rows that attend to one NaN.
      std::uint32_t nf[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) nf[j] = take_non_finite_f32(b[j]);
      float hit[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      mma_tf32(hit[0], att, nf[0], nf[1]);
      mma_tf32(hit[1], att, nf[2], nf[3]);
      mma_3xtf32(o[2 * m], a, b[0], b[1]);
      mma_3xtf32(o[2 * m + 1], a, b[2], b[3]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (hit[h][e] > 0.f) o[2 * m + h][e] = NAN;
        }
      }
    }
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o_total[n][e] += o[n][e];
  }
}

// O += P V for slice sl of tile vS (s: its weights) from a 16-bit or 8-bit tile, P as the A operand
// in hi and lo parts (lo
// only with kLo, which is p.p_lo: a compile-time flag here so that a fold's P V products for all
// its slices are one straight run of code, the fragments of the next slice loaded while the
// products of this one issue). disagree, keep: whether the rows disagree on the slice and each
// element's verdict (mma_keep_bits).
template <typename T, int D, bool kLo>
__device__ __forceinline__ void mma16_values(const int (&v_at)[4], const char* vS, int sl,
                                             const float (&s)[2][4], bool disagree, unsigned keep,
                                             float (&o)[D / 8][4]) {
  using Cfg = MmaCfg<T, D>;
  using Op = MmaOp<typename Cfg::MmaT>;
  std::uint32_t ph[4], pl[4] = {0u, 0u, 0u, 0u};
  {
    const float* src[4] = {&s[0][0], &s[0][2], &s[1][0], &s[1][2]};
#pragma unroll
    for (int r = 0; r < 4; ++r) ph[r] = Op::pack(src[r][0], src[r][1]);
    if constexpr (kLo) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float h0, h1;
        Op::unpack(ph[r], h0, h1);
        pl[r] = Op::pack(src[r][0] - h0, src[r][1] - h1);
      }
    }
  }
  const char* v_slice = vS + sl * 16 * Cfg::ROW;
  if (!disagree) {
    for_v_tiles<T, D>(v_slice, v_at, [&](int n, const std::uint32_t(&b)[4]) {
      Op::mma(o[n], ph, b[0], b[1]);
      Op::mma(o[n + 1], ph, b[2], b[3]);
      if constexpr (kLo) {
        Op::mma(o[n], pl, b[0], b[1]);
        Op::mma(o[n + 1], pl, b[2], b[3]);
      }
    });
  } else {
    // A token one row attends to and another does not (a weight of 0 there) must not bring
    // a non-finite value of V into the second row: 0 x NaN is NaN. So V's non-finite values
    // go in as 0, and an indicator product (1 where a row attends to a token, times 1 where
    // the token's V is not finite) makes the columns of the rows that do attend to one NaN.
    std::uint32_t att[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int bit = (r >> 1) * 4 + (r & 1) * 2;  // element (n, e) of the pair's first value
      att[r] =
          ((keep >> bit) & 1u ? Op::kOne : 0u) | ((keep >> (bit + 1)) & 1u ? Op::kOne << 16 : 0u);
    }
    for_v_tiles<T, D>(v_slice, v_at, [&](int n, const std::uint32_t(&b_in)[4]) {
      std::uint32_t b[4] = {b_in[0], b_in[1], b_in[2], b_in[3]}, nf[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) nf[j] = take_non_finite<Op>(b[j]);
      float hit[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      Op::mma(hit[0], att, nf[0], nf[1]);
      Op::mma(hit[1], att, nf[2], nf[3]);
      Op::mma(o[n], ph, b[0], b[1]);
      Op::mma(o[n + 1], ph, b[2], b[3]);
      if constexpr (kLo) {
        Op::mma(o[n], pl, b[0], b[1]);
        Op::mma(o[n + 1], pl, b[2], b[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (hit[h][e] > 0.f) o[n + h][e] = NAN;
        }
      }
    });
  }
}

// O += P V for slice sl of tile vS: mma16_values, or tf32_values for an f32 tile.
template <typename T, int D, bool kLo>
__device__ __forceinline__ void mma_values(const int (&v_at)[4], const char* vS, int sl,
                                           const float (&s)[2][4], bool disagree, unsigned keep,
                                           float (&o)[D / 8][4]) {
  if constexpr (MmaCfg<T, D>::kTf32) {
    tf32_values<D>(v_at, vS + sl * 16 * MmaCfg<T, D>::ROW, s, disagree, keep, o);
  } else {
    mma16_values<T, D, kLo>(v_at, vS, sl, s, disagree, keep, o);
  }
}

}  // namespace pagedattn::detail::cuda
