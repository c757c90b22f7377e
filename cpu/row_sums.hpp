// Sums of W rows at once: out[i] = sum of the lanes of rows[i], for W = the batch width.
// xsimd::haddp does this, but the AVX-512 version in xsimd 8.1 returns the sums of rows 2-5 and
// 10-13 in the wrong lanes (rows 2,3 swapped with 4,5), so AVX-512 gets its own reduction.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

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
template <>
struct RowSums<xsimd::avx512bw> {
  // Eight 8-wide rows to their eight sums: two rounds of hadd leave each 128-bit lane with four
  // partial sums, and adding the two lanes finishes them.
  static __m256 of8(const __m256* h) {
    const __m256 a01 = _mm256_hadd_ps(h[0], h[1]), a23 = _mm256_hadd_ps(h[2], h[3]);
    const __m256 a45 = _mm256_hadd_ps(h[4], h[5]), a67 = _mm256_hadd_ps(h[6], h[7]);
    const __m256 b0 = _mm256_hadd_ps(a01, a23), b1 = _mm256_hadd_ps(a45, a67);
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20),
                         _mm256_permute2f128_ps(b0, b1, 0x31));
  }
  static xsimd::batch<float, xsimd::avx512bw> of(const xsimd::batch<float, xsimd::avx512bw>* rows) {
    __m256 half[16];
    for (int i = 0; i < 16; ++i) {
      const __m512 r = rows[i];
      half[i] = _mm256_add_ps(_mm512_castps512_ps256(r), _mm512_extractf32x8_ps(r, 1));
    }
    const __m512 lo = _mm512_castps256_ps512(of8(half));
    return _mm512_insertf32x8(lo, of8(half + 8), 1);
  }
};
#endif

}  // namespace
}  // namespace pagedattn::detail::cpu
