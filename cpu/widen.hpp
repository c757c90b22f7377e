// Loads of one SIMD batch of f32 from each storage type. xsimd 8.1 has no f16/bf16/fp8 batches,
// so the narrow types are widened by hand per instruction set: F16C (x86) or FCVTL (AArch64) for
// f16, a 16-bit shift for bf16, fp8 through f16 on AVX2 and AVX-512, or through a bf16 table
// where AVX-512 VBMI is built in (element by element elsewhere).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <cmath>
#include <cstdint>
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
// nothing is permuted. Where it widens T four batches at a time (kQuads<T>, with load_quad: fp8
// through a table on AVX-512 VBMI, for the V side of a bf16 q's dot products), they come in quad
// order (quad_dim), which the accumulators follow as for pairs.
// Portable widening: element by element into an aligned buffer (the fp8 formats where the set
// has no vector path for them).
template <class Arch, class T>
inline fbatch<Arch> widen_scalar(const T* p) {
  alignas(64) float tmp[fbatch<Arch>::size];
  for (std::size_t i = 0; i < fbatch<Arch>::size; ++i) tmp[i] = to_float(p[i]);
  return fbatch<Arch>::load_aligned(tmp);
}

// The widening of a set without vector paths of its own: one batch at a time, f32 as it is, every
// other type element by element, nothing scaled. Widen itself where a set has no specialization;
// the base of those (SSE2, NEON) that add vector loads for some types only.
template <class Arch>
struct WidenPortable {
  template <class T>
  static constexpr bool kPairs = false;
  template <class T>
  static constexpr bool kTwo = false;
  template <class T>
  static constexpr bool kQuads = false;
  // A widened element times kScale<T> is the element's value (a power of two: see fp8 below).
  template <class T>
  static constexpr float kScale = 1.f;
  template <class T>
  static fbatch<Arch> load(const T* p) {
    return widen_scalar<Arch>(p);
  }
  static fbatch<Arch> load(const float* p) { return fbatch<Arch>::load_unaligned(p); }
};

template <class Arch>
struct Widen : WidenPortable<Arch> {};

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
struct Widen<xsimd::sse2> : WidenPortable<xsimd::sse2> {
  using A = xsimd::sse2;
  using WidenPortable<A>::load;  // f32, and the types without a load below
  static fbatch<A> load(const bf16_t* p) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), x));  // bits << 16
  }
  static fbatch<A> load(const f16_t* p) {
    alignas(16) float tmp[4];
    for (int i = 0; i < 4; ++i) tmp[i] = f16_to_float(p[i]);
    return fbatch<A>::load_aligned(tmp);
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
  static constexpr bool kQuads = false;
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
  // conversions. (e5m2, a shift alone, has no fix-up to share, so it widens one batch at a time.)
  static void load_two(const fp8_e4m3_t* p, fbatch<A>& a, fbatch<A>& b) {
    const __m256i f =
        e4m3_f16_bits(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    a = _mm256_cvtph_ps(_mm256_castsi256_si128(f));
    b = _mm256_cvtph_ps(_mm256_extracti128_si256(f, 1));
  }
};
#endif

// fp8 to bf16 through a table (AVX-512 VBMI): the bf16 bits of every magnitude code (the low 7
// bits) of a format, as what the other widenings read, the value / kScale (e4m3: value x 2^-8,
// e5m2: the value), exact in bf16 whatever the code: both formats' subnormals become normal bf16
// (2^-17 and 2^-16 at the smallest), e4m3's NaN code and e5m2's infinities and NaNs their bf16
// kind. Split into the low and the high byte of each entry, so that two vpermi2b look up 64 codes
// at once (the index's bit 6 picks the table half, bit 7, the sign, is ignored).
struct Fp8Bf16Table {
  alignas(64) std::uint8_t lo[128] = {};
  alignas(64) std::uint8_t hi[128] = {};
  // bf16 bits of +M x 2^e (M an integer of up to 4 bits, M > 0): normalized to a leading 1.
  static constexpr std::uint16_t bits_of(unsigned M, int e) {
    int top = 0;
    while ((M >> (top + 1)) != 0) ++top;  // M's highest set bit
    const unsigned mant = (M << (7 - top)) & 0x7fu;
    return static_cast<std::uint16_t>(((e + top + 127) << 7) | mant);
  }
  // e4m3 magnitude m = E.MMM (bias 7) times 2^-8: normal 2^(E-7) (8 + M) / 8, subnormal M 2^-9.
  static constexpr std::uint16_t e4m3(unsigned m) {
    const unsigned E = m >> 3, M = m & 7u;
    if (m == 0x7fu) return 0x7fc0;  // NaN
    if (m == 0) return 0;
    return E == 0 ? bits_of(M, -9 - 8) : bits_of(8 + M, static_cast<int>(E) - 7 - 3 - 8);
  }
  // e5m2 magnitude m = E.MM (bias 15): normal 2^(E-15) (4 + M) / 4, subnormal M 2^-16; E = 31
  // is infinity (M = 0) or NaN.
  static constexpr std::uint16_t e5m2(unsigned m) {
    const unsigned E = m >> 2, M = m & 3u;
    if (E == 31) return M == 0 ? 0x7f80 : 0x7fc0;
    if (m == 0) return 0;
    return E == 0 ? bits_of(M, -16) : bits_of(4 + M, static_cast<int>(E) - 15 - 2);
  }
  constexpr explicit Fp8Bf16Table(bool is_e4m3) {
    for (unsigned m = 0; m < 128; ++m) {
      const std::uint16_t b = is_e4m3 ? e4m3(m) : e5m2(m);
      lo[m] = static_cast<std::uint8_t>(b & 0xffu);
      hi[m] = static_cast<std::uint8_t>(b >> 8);
    }
  }
};
template <class T>
inline constexpr Fp8Bf16Table kFp8Bf16Table{std::is_same_v<T, fp8_e4m3_t>};

// Quad order (Widen<avx512bw>::load_quad): within each chunk of 64 elements, element k of batch m
// (m < 4, k < 16) is element quad_dim(m, k) of the chunk. It falls out of the byte unpacks (each
// 128-bit lane interleaves its own 8 + 8 codes) and the even / odd split of bf16 pairs.
constexpr int quad_dim(int m, int k) {
  return 16 * (k >> 2) + 8 * (m >> 1) + 2 * (k & 3) + (m & 1);
}
// bf16 word order (load_bf16_words): word n of w (w = 0, 1) is element 16 (n / 8) + 8 w + n % 8.
constexpr int word_dim(int w, int n) { return 16 * (n >> 3) + 8 * w + (n & 7); }

#if XSIMD_WITH_AVX512BW
template <>
struct Widen<xsimd::avx512bw> {
  using A = xsimd::avx512bw;
  // bf16 in pairs, as on AVX2: one 64-byte load, a shift and an and widen 32 elements.
  template <class T>
  static constexpr bool kPairs = std::is_same_v<T, bf16_t>;
  // fp8 through the bf16 table where VBMI is built in (load_quad below), else e4m3 32 codes at a
  // time, in order, as on AVX2. (One P path per type: a head dim that is no multiple of 64 takes
  // the single loads there.)
#if defined(__AVX512VBMI__)
  static constexpr bool kTable = true;
#else
  static constexpr bool kTable = false;
#endif
  template <class T>
  static constexpr bool kQuads = (kTable && is_fp8_type<T>);
  template <class T>
  static constexpr bool kTwo = std::is_same_v<T, fp8_e4m3_t> && !kTable;
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
#if defined(__AVX512VBMI__)
  // fp8 64 codes at a time through Fp8Bf16Table: two vpermi2b (low and high bytes of the bf16
  // bits), the sign or-ed in, two byte unpacks give 64 bf16 values, in word order
  // (load_bf16_words) for bf16 dot products or, as even / odd f32 halves, in quad order
  // (load_quad). About 2.5 instructions per 32 codes to bf16 and 4.5 to f32, against 8 through f16.
  // The table in registers (four of them), for loops that keep it there.
  struct TableRegs {
    __m512i lo0, lo1, hi0, hi1;
    template <class T>
    static TableRegs of() {
      const Fp8Bf16Table& t = kFp8Bf16Table<T>;
      return {_mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 64), _mm512_load_si512(t.hi),
              _mm512_load_si512(t.hi + 64)};
    }
  };
  static void load_bf16_words(const void* p, const TableRegs& t, __m512i& w0, __m512i& w1) {
    const __m512i c = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutex2var_epi8(t.lo0, c, t.lo1);
    __m512i hi = _mm512_permutex2var_epi8(t.hi0, c, t.hi1);
    hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8(static_cast<char>(0x80)),
                                   0xf8);  // hi | (c & 0x80): the sign
    w0 = _mm512_unpacklo_epi8(lo, hi);
    w1 = _mm512_unpackhi_epi8(lo, hi);
  }
  template <class T>
  static void load_bf16_words(const T* p, __m512i& w0, __m512i& w1) {
    load_bf16_words(p, TableRegs::template of<T>(), w0, w1);
  }
  template <class T>
  static void load_quad(const T* p, fbatch<A> (&x)[4]) {
    __m512i w[2];
    load_bf16_words(p, w[0], w[1]);
    for (int i = 0; i < 2; ++i) {
      x[2 * i] = _mm512_castsi512_ps(_mm512_slli_epi32(w[i], 16));
      x[2 * i + 1] = _mm512_castsi512_ps(_mm512_and_si512(w[i], _mm512_set1_epi32(-65536)));
    }
  }
#endif
};
#endif

#if XSIMD_WITH_NEON64
template <>
struct Widen<xsimd::neon64> : WidenPortable<xsimd::neon64> {
  using A = xsimd::neon64;
  using WidenPortable<A>::load;             // f32, and the types without a load below
  static fbatch<A> load(const bf16_t* p) {  // zero-extend each 16-bit element and shift it up
    const uint16x4_t x = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
    return vreinterpretq_f32_u32(vshll_n_u16(x, 16));
  }
  static fbatch<A> load(const f16_t* p) {  // exact, as the scalar f16_to_float
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const std::uint16_t*>(p))));
  }
};
#endif

// Batches that one grouped widening step yields (the kernels' P path): 4 where the set widens T
// in quads, else 2 (pairs or two in order).
template <class Arch, class T>
constexpr int kGroupBatches = Widen<Arch>::template kQuads<T> ? 4 : 2;

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

// kGroupBatches<Arch, T> consecutive batches of p: a quad (in quad order) or a pair.
template <class Arch, class T, int N>
inline void load_group(const T* p, fbatch<Arch> (&x)[N]) {
  static_assert(N == kGroupBatches<Arch, T>, "the set's group size");
  if constexpr (N == 4) {
    Widen<Arch>::load_quad(p, x);
  } else {
    load_pair<Arch>(p, x[0], x[1]);
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
