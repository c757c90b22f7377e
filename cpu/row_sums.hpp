// Sums of W rows at once: out[i] = sum of the lanes of rows[i], for W = the batch width.
// xsimd::haddp does this, but the AVX-512 version in xsimd 8.1 returns the sums of rows 2-5 and
// 10-13 in the wrong lanes (rows 2,3 swapped with 4,5) and goes through memory, so AVX-512 gets
// its own reduction.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <xsimd/xsimd.hpp>

namespace pagedattn::detail::cpu {
namespace {

template <class Arch>
struct RowSums {
  static xsimd::batch<float, Arch> of(const xsimd::batch<float, Arch>* rows) {
    return xsimd::haddp(rows);
  }
};

#if XSIMD_WITH_AVX512BW
// A transposing tree in registers: each level pairs two vectors, puts their halves side by side
// with two shuffles and combines them (Op: add or max), so the number of vectors and of partial
// results per row halve together (16 rows x 16 partials -> 8 x (2 rows x 8) -> 4 x (4 x 4) -> 2 x
// (8 x 2) -> 16 x 1): 30 shuffles and 15 Ops, then one permute puts the results in row order.
template <class Op>
struct RowTree512 {
  template <int kLevel>
  static __m512 pair(__m512 a, __m512 b) {
    if constexpr (kLevel == 0) {  // 256-bit halves: [a.lo, b.lo] + [a.hi, b.hi]
      return Op::apply(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    } else if constexpr (kLevel == 1) {  // 128-bit lanes: [a0, a2, b0, b2] + [a1, a3, b1, b3]
      return Op::apply(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
    } else if constexpr (kLevel == 2) {  // 64-bit halves of each 128-bit lane
      return Op::apply(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
    } else {  // even and odd elements of each 128-bit lane
      return Op::apply(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
    }
  }
  __attribute__((always_inline)) static __m512 of(const __m512* rows) {
    __m512 v[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) v[i] = pair<0>(rows[2 * i], rows[2 * i + 1]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) v[i] = pair<1>(v[2 * i], v[2 * i + 1]);
    v[0] = pair<2>(v[0], v[1]);
    v[1] = pair<2>(v[2], v[3]);
    v[0] = pair<3>(v[0], v[1]);
    // Lane 4 * L + p now holds row 4 * p + L.
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, v[0]);
  }
};
struct AddOp512 {
  static __m512 apply(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
};
// The larger of a and b, b where either is NaN (vmaxps): callers keep NaN out of the rows.
struct MaxOp512 {
  static __m512 apply(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
};

// xsimd::haddp's AVX-512 version in xsimd 8.1 is wrong (above); this one is the tree.
// Forced inline: out of line, the caller's accumulators go through the stack (16 stores and
// loads per call), and GCC alone keeps the call in the AVX-512 BF16 kernel (docs/cpu.md).
template <>
struct RowSums<xsimd::avx512bw> {
  __attribute__((always_inline)) static xsimd::batch<float, xsimd::avx512bw> of(
      const xsimd::batch<float, xsimd::avx512bw>* rows) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = rows[i];
    return RowTree512<AddOp512>::of(r);
  }
};
#endif

// The largest lane and the sum of the lanes of one batch: a tree of shuffles where the set has
// them (log2(W) steps, no chain of W dependent scalar operations), else lane by lane. The sum's
// order is fixed per instruction set. max ignores NaN lanes (-inf when every lane is NaN), as
// std::max from -inf over the lanes does: a NaN logit must reach the weights and the sum, not
// the running max.
template <class Arch>
struct LaneReduce {
  static float max(const xsimd::batch<float, Arch>& x) {
    alignas(64) float lanes[xsimd::batch<float, Arch>::size];
    x.store_aligned(lanes);
    float m = -INFINITY;
    for (std::size_t i = 0; i < xsimd::batch<float, Arch>::size; ++i) m = std::max(m, lanes[i]);
    return m;
  }
  static float sum(const xsimd::batch<float, Arch>& x) {
    alignas(64) float lanes[xsimd::batch<float, Arch>::size];
    x.store_aligned(lanes);
    float s = 0.f;
    for (std::size_t i = 0; i < xsimd::batch<float, Arch>::size; ++i) s += lanes[i];
    return s;
  }
};

#if XSIMD_WITH_AVX512BW
template <>
struct LaneReduce<xsimd::avx512bw> {
  template <class Op>
  static float tree(__m512 x, Op op) {
    x = op(x, _mm512_shuffle_f32x4(x, x, 0x4E));  // swap the 256-bit halves
    x = op(x, _mm512_shuffle_f32x4(x, x, 0xB1));  // swap neighbouring 128-bit lanes
    x = op(x, _mm512_shuffle_ps(x, x, 0x4E));     // swap 64-bit halves of each lane
    x = op(x, _mm512_shuffle_ps(x, x, 0xB1));     // swap neighbouring elements
    return _mm512_cvtss_f32(x);
  }
  static float max(const xsimd::batch<float, xsimd::avx512bw>& x) {
    const __m512 clean =
        _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_ps(-INFINITY));
    return tree(clean, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
  }
  static float sum(const xsimd::batch<float, xsimd::avx512bw>& x) {
    return tree(x, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
  }
};
#endif

#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2
template <>
struct LaneReduce<xsimd::fma3<xsimd::avx2>> {
  template <class Op>
  static float tree(__m256 x, Op op) {
    x = op(x, _mm256_permute2f128_ps(x, x, 0x01));  // swap the 128-bit halves
    x = op(x, _mm256_shuffle_ps(x, x, 0x4E));       // swap 64-bit halves of each lane
    x = op(x, _mm256_shuffle_ps(x, x, 0xB1));       // swap neighbouring elements
    return _mm256_cvtss_f32(x);
  }
  static float max(const xsimd::batch<float, xsimd::fma3<xsimd::avx2>>& x) {
    const __m256 clean =
        _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return tree(clean, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); });
  }
  static float sum(const xsimd::batch<float, xsimd::fma3<xsimd::avx2>>& x) {
    return tree(x, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
  }
};
#endif

}  // namespace
}  // namespace pagedattn::detail::cpu
