// Loads of one SIMD batch of f32 from each storage type. xsimd 8.1 has no f16/bf16/fp8 batches,
// so the narrow types are widened by hand per instruction set: F16C (x86) or FCVTL (AArch64) for
// f16, a 16-bit shift for bf16, fp8 through f16 on AVX2 and AVX-512 (element by element
// elsewhere).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <cmath>
#include <type_traits>
#include <xsimd/xsimd.hpp>

#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cpu {
namespace {

template <class Arch>
using fbatch = xsimd::batch<float, Arch>;

// Two consecutive batches p[0, 2W) (load_pair below): a = p[0, W), b = p[W, 2W) in order, unless
// the set widens in pairs (kPairs<T>, with load_even_odd): then a holds the even and b the odd
// elements of p[0, 2W), which is cheaper for bf16 (one load, one shift, one and, instead of two
// zero-extending loads and two shifts). Callers that use pairs permute q and the accumulators to
// match (see PairOrder). Where the set widens T two batches at a time in order (kTwo<T>, with
// load_two: e4m3 on AVX2 and AVX-512, one widening to 16 bits and one f16 fix-up for 2W codes),
// nothing is permuted.
// Portable widening: element by element into an aligned buffer (the fp8 formats where the set
// has no vector path for them).
template <class Arch, class T>
inline fbatch<Arch> widen_scalar(const T* p) {
  alignas(64) float tmp[fbatch<Arch>::size];
  for (std::size_t i = 0; i < fbatch<Arch>::size; ++i) tmp[i] = to_float(p[i]);
  return fbatch<Arch>::load_aligned(tmp);
}

template <class Arch>
struct Widen {
  template <class T>
  static constexpr bool kPairs = false;
  template <class T>
  static constexpr bool kTwo = false;
  // A widened element times kScale<T> is the element's value (a power of two: see fp8 below).
  template <class T>
  static constexpr float kScale = 1.f;
  template <class T>
  static fbatch<Arch> load(const T* p) {
    return widen_scalar<Arch>(p);
  }
  static fbatch<Arch> load(const float* p) { return fbatch<Arch>::load_unaligned(p); }
};

// fp8 through f16 (both exact): e5m2 is the top byte of an f16. e4m3's magnitude bits shifted
// into an f16's exponent and mantissa read as the value times 2^-8, subnormals included (both
// formats' subnormals are plain multiples of their smallest step); the kernel multiplies the
// logits and the weighted sums by 256 (kScale) instead of every element, and e4m3's NaN code
// (S.1111.111, which would read as 480 x 2^-8) becomes the f16 NaN 0xffff. From the codes
// sign-extended to 16 bits (s): s << 7 has the magnitude in bits 7-13 and the sign in bits 14
// and 15, so clearing bit 14 leaves the f16; the magnitude is 0x7f exactly when the low 7 bits of
// s + 1 are 0 (0x007f + 1 = 0x0080, 0xffff + 1 = 0). Five instructions per vector of 16-bit
// lanes (8, 16 or 32 codes), no multiply, no f32 blend.
#if defined(__F16C__) || defined(__AVX512F__)
inline __m128i e5m2_f16_bits(__m128i c16) { return _mm_slli_epi16(c16, 8); }
inline __m128i e4m3_f16_bits(__m128i s) {
  const __m128i nan =
      _mm_cmpeq_epi16(_mm_and_si128(_mm_add_epi16(s, _mm_set1_epi16(1)), _mm_set1_epi16(0x7f)),
                      _mm_setzero_si128());
  return _mm_or_si128(_mm_and_si128(_mm_slli_epi16(s, 7), _mm_set1_epi16(-16385)), nan);
}
#endif
#if defined(__AVX2__)
inline __m256i e4m3_f16_bits(__m256i s) {
  const __m256i nan = _mm256_cmpeq_epi16(
      _mm256_and_si256(_mm256_add_epi16(s, _mm256_set1_epi16(1)), _mm256_set1_epi16(0x7f)),
      _mm256_setzero_si256());
  return _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(s, 7), _mm256_set1_epi16(-16385)), nan);
}
#endif
#if defined(__AVX512BW__)
inline __m512i e4m3_f16_bits(__m512i s) {
  const __mmask32 nan =
      _mm512_testn_epi16_mask(_mm512_add_epi16(s, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7f));
  return _mm512_mask_mov_epi16(_mm512_and_si512(_mm512_slli_epi16(s, 7), _mm512_set1_epi16(-16385)),
                               nan, _mm512_set1_epi16(-1));
}
#endif

#if XSIMD_WITH_SSE2
template <>
struct Widen<xsimd::sse2> {
  using A = xsimd::sse2;
  template <class T>
  static constexpr bool kPairs = false;
  template <class T>
  static constexpr bool kTwo = false;
  template <class T>
  static constexpr float kScale = 1.f;
  static fbatch<A> load(const float* p) { return fbatch<A>::load_unaligned(p); }
  static fbatch<A> load(const bf16_t* p) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), x));  // bits << 16
  }
  static fbatch<A> load(const f16_t* p) {
    alignas(16) float tmp[4];
    for (int i = 0; i < 4; ++i) tmp[i] = f16_to_float(p[i]);
    return fbatch<A>::load_aligned(tmp);
  }
  template <class T>
  static fbatch<A> load(const T* p) {
    return widen_scalar<A>(p);
  }
};
#endif

#if XSIMD_WITH_AVX2 && XSIMD_WITH_FMA3_AVX2 && defined(__F16C__)
template <>
struct Widen<xsimd::fma3<xsimd::avx2>> {
  using A = xsimd::fma3<xsimd::avx2>;
  template <class T>
  static constexpr bool kPairs = std::is_same_v<T, bf16_t>;
  template <class T>
  static constexpr bool kTwo = std::is_same_v<T, fp8_e4m3_t>;
  template <class T>
  static constexpr float kScale = std::is_same_v<T, fp8_e4m3_t> ? 256.f : 1.f;
  // kPairs<bf16_t>: each 32-bit lane holds elements (2i, 2i + 1): the even one is its low half,
  // shifted up it is the f32; the odd one is its high half, already in place once the low half
  // is 0.
  static void load_even_odd(const bf16_t* p, fbatch<A>& a, fbatch<A>& b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(-65536)));
  }
  static fbatch<A> load(const float* p) { return fbatch<A>::load_unaligned(p); }
  static fbatch<A> load(const bf16_t* p) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
  }
  static fbatch<A> load(const f16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static fbatch<A> load(const fp8_e5m2_t* p) {
    const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(e5m2_f16_bits(c));
  }
  static fbatch<A> load(const fp8_e4m3_t* p) {
    const __m128i s = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(e4m3_f16_bits(s));
  }
  // e4m3 16 codes at a time, in order: one widening to 16 bits and one f16 fix-up for both
  // conversions. (e5m2, a shift alone, measured no faster that way.)
  static void load_two(const fp8_e4m3_t* p, fbatch<A>& a, fbatch<A>& b) {
    const __m256i f =
        e4m3_f16_bits(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    a = _mm256_cvtph_ps(_mm256_castsi256_si128(f));
    b = _mm256_cvtph_ps(_mm256_extracti128_si256(f, 1));
  }
};
#endif

#if XSIMD_WITH_AVX512BW
template <>
struct Widen<xsimd::avx512bw> {
  using A = xsimd::avx512bw;
  // bf16 in pairs, as on AVX2: one 64-byte load, a shift and an and widen 32 elements.
  template <class T>
  static constexpr bool kPairs = std::is_same_v<T, bf16_t>;
  // e4m3 32 codes at a time, in order, as on AVX2.
  template <class T>
  static constexpr bool kTwo = std::is_same_v<T, fp8_e4m3_t>;
  template <class T>
  static constexpr float kScale = std::is_same_v<T, fp8_e4m3_t> ? 256.f : 1.f;
  static void load_two(const fp8_e4m3_t* p, fbatch<A>& a, fbatch<A>& b) {
    const __m512i f = e4m3_f16_bits(
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    a = _mm512_cvtph_ps(_mm512_castsi512_si256(f));
    b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f, 1));
  }
  static void load_even_odd(const bf16_t* p, fbatch<A>& a, fbatch<A>& b) {
    const __m512i x = _mm512_loadu_si512(p);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536)));
  }
  static fbatch<A> load(const float* p) { return fbatch<A>::load_unaligned(p); }
  static fbatch<A> load(const bf16_t* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
  }
  static fbatch<A> load(const f16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static fbatch<A> load(const fp8_e5m2_t* p) {
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(_mm256_slli_epi16(c, 8));
  }
  static fbatch<A> load(const fp8_e4m3_t* p) {
    const __m512i s = _mm512_cvtepi8_epi16(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(e4m3_f16_bits(s)));
  }
};
#endif

#if XSIMD_WITH_NEON64
template <>
struct Widen<xsimd::neon64> {
  using A = xsimd::neon64;
  template <class T>
  static constexpr bool kPairs = false;
  template <class T>
  static constexpr bool kTwo = false;
  template <class T>
  static constexpr float kScale = 1.f;
  static fbatch<A> load(const float* p) { return fbatch<A>::load_unaligned(p); }
  static fbatch<A> load(const bf16_t* p) {  // zero-extend each 16-bit element and shift it up
    const uint16x4_t x = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
    return vreinterpretq_f32_u32(vshll_n_u16(x, 16));
  }
  static fbatch<A> load(const f16_t* p) {  // exact, as the scalar f16_to_float
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const std::uint16_t*>(p))));
  }
  template <class T>
  static fbatch<A> load(const T* p) {
    return widen_scalar<A>(p);
  }
};
#endif

// Two consecutive batches of p (see Widen): in order, or as even and odd elements where the
// instruction set widens T in pairs; in order in one step where it widens two at a time.
template <class Arch, class T>
inline void load_pair(const T* p, fbatch<Arch>& a, fbatch<Arch>& b) {
  if constexpr (Widen<Arch>::template kPairs<T>) {
    Widen<Arch>::load_even_odd(p, a, b);
  } else if constexpr (Widen<Arch>::template kTwo<T>) {
    Widen<Arch>::load_two(p, a, b);
  } else {
    a = Widen<Arch>::load(p);
    b = Widen<Arch>::load(p + fbatch<Arch>::size);
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
