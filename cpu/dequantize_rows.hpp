// Rows of a quantized cache block (fp8, int8 or int4 codes) as f32, each row times its own scale
// (an int4 row: each group of 32 values times its own): the CPU backend's path for caches it does
// not widen in the tiles (int8, int4, and per-token scales), which then runs the f32 kernel over
// the rows.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "pagedattn/dtype.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// One int4 row of D values (D / 2 bytes, a multiple of 16) as f32: each group of 32 values times
// its own scale (group_scales[k] for values [32k, 32k + 32)). With AVX2 or AVX-512 (this header
// is compiled once per instruction set): a group's 16 bytes split into low and high nibbles,
// interleaved back into element order (the even element from the low nibble), sign-extended as
// (n ^ 8) - 8, widened to 32 bits, converted and scaled, 8 or 16 values at a time. Elsewhere (SSE2,
// NEON) a plain loop over the bytes.
inline void dequantize_int4_row(const std::uint8_t* __restrict row, int D,
                                const float* __restrict group_scales, float* __restrict out) {
  constexpr int kGroup = kInt4GroupSize;
  for (int k = 0; k < D / kGroup; ++k) {
    const std::uint8_t* bytes = row + k * (kGroup / 2);
    const float s = group_scales[k];
    float* o = out + k * kGroup;
#if defined(__AVX2__)
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(b, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    // Codes 0..15 of elements 0-15 and 16-31, then -8..7.
    const __m128i c0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
    const __m128i c1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
#if defined(__AVX512F__)
    const __m512 scale = _mm512_set1_ps(s);
    _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c0)), scale));
    _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c1)), scale));
#else
    const __m256 scale = _mm256_set1_ps(s);
    const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
    for (int p = 0; p < 4; ++p) {
      _mm256_storeu_ps(o + 8 * p,
                       _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p])), scale));
    }
#endif
#else
    for (int j = 0; j < kGroup / 2; ++j) {
      const std::uint8_t v = bytes[j];
      o[2 * j] = static_cast<float>(int4_low(v)) * s;
      o[2 * j + 1] = static_cast<float>(int4_high(v)) * s;
    }
#endif
  }
}

// dst[t * D + d] = value(src[t * ts + d]) x scales[t * scale_stride] for t < n, d < D (scales
// null: x 1). D is a multiple of the batch width (every supported head dim is of 16). For int4
// (T = int4x2_t: ts counts bytes) the scales are required and a row has D / 32 of them from
// scales[t * scale_stride] on, one per group of 32 values.
template <class Arch, class T>
void dequantize_rows(const T* src, std::int64_t ts, int n, int D, const float* scales,
                     std::int64_t scale_stride, float* dst) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  for (int t = 0; t < n; ++t) {
    float* __restrict out = dst + static_cast<std::int64_t>(t) * D;
    if constexpr (std::is_same_v<T, int4x2_t>) {
      dequantize_int4_row(reinterpret_cast<const std::uint8_t*>(src + t * ts), D,
                          scales + t * scale_stride, out);
    } else if constexpr (std::is_same_v<T, int8_code_t>) {
      // Sign-extend and convert: the compiler vectorizes this loop for each instruction set.
      const float s = scales != nullptr ? scales[t * scale_stride] : 1.f;
      const std::int8_t* __restrict row = reinterpret_cast<const std::int8_t*>(src + t * ts);
      for (int d = 0; d < D; ++d) out[d] = static_cast<float>(row[d]) * s;
    } else {
      const float s = scales != nullptr ? scales[t * scale_stride] : 1.f;
      // fp8 through the set's own widening, which reads value / kScale.
      const B scale(s * Widen<Arch>::template kScale<T>);
      const T* row = src + t * ts;
      for (int d = 0; d < D; d += W) (Widen<Arch>::load(row + d) * scale).store_unaligned(out + d);
    }
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
