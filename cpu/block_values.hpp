// P.V of one block for a tile of query heads: the weighted V rows added to the accumulators, in
// f32 on widened V (or, on AVX-512 BF16, as bf16 dot products of two tokens at once).
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include <cstdint>
#include <cstring>

#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// acc_r[d0, d0 + DC * W) += sum_{t < n} p[r * ps + t] * v_t[d0, d0 + DC * W) for r < R.
template <class Arch, int R, int DC, bool P, class T>
inline void values_tile(const float* p, int ps, const T* v, std::int64_t ts, int n, float* acc,
                        int D, int d0) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  B a[R * DC];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) a[r * DC + c] = B::load_unaligned(acc + r * D + d0 + c * W);
  }
#pragma GCC unroll 2
  for (int t = 0; t < n; ++t) {
    B vv[DC];
    if constexpr (P && kGroupBatches<Arch, T> == 2) {
#pragma GCC unroll 16
      for (int c = 0; c < DC; c += 2) load_pair<Arch>(v + t * ts + d0 + c * W, vv[c], vv[c + 1]);
    } else if constexpr (P) {
      constexpr int NG = kGroupBatches<Arch, T>;
      static_assert(DC % NG == 0, "whole groups of vectors");
#pragma GCC unroll 16
      for (int c = 0; c < DC; c += NG) {
        B x[NG];
        load_group<Arch>(v + t * ts + d0 + c * W, x);
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) vv[c + g] = x[g];
      }
    } else {
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c) vv[c] = Widen<Arch>::load(v + t * ts + d0 + c * W);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const B pp(p[r * ps + t]);
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c) a[r * DC + c] = xsimd::fma(pp, vv[c], a[r * DC + c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) a[r * DC + c].store_unaligned(acc + r * D + d0 + c * W);
  }
}

#if defined(__AVX512BF16__)
// values_tile with the weights rounded to bf16 (ItemContext::bf16_weights), for a bf16 cache or
// an fp8 one through the bf16 table: vdpbf16ps multiplies two tokens at once. The bf16 words of V
// rows t and t + 1 are interleaved (vpunpcklwd / vpunpckhwd), each head's weights (p_t, p_t+1)
// are one broadcast 32-bit pair, and one instruction adds p_t v_t[d] + p_t+1 v_t+1[d] for 16 head
// dims: half the products of the f32 path, and no widening to f32. The accumulators run in
// token-pair order (from_token_pair_order puts them back): output vector 2 w + h of a chunk, lane
// j, holds word 8 (j / 4) + 4 h + j % 4 of the chunk's w-th word vector (a bf16 cache: 32
// elements per chunk, one word vector; fp8: 64 codes per chunk in two, word_dim). An odd last
// token is paired with zeros (its successor's row is not read: past the context it may hold
// anything).
template <int R, int DC, class T>
inline void values_tile_dp(const bf16_t* p, int ps, const T* v, std::int64_t ts, int n, float* acc,
                           int D, int d0) {
  constexpr bool kFp8 = is_fp8_type<T>;
  constexpr int kChunk = kFp8 ? 4 : 2;  // output vectors per chunk of words
  static_assert(DC % kChunk == 0, "whole chunks");
  __m512 a[R * DC];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) a[r * DC + c] = _mm512_loadu_ps(acc + r * D + d0 + c * 16);
  }
#if defined(__AVX512VBMI__)
  using Wd = Widen<xsimd::avx512bw>;
  [[maybe_unused]] typename Wd::TableRegs tab{};
  if constexpr (kFp8) tab = Wd::TableRegs::template of<T>();
#else
  static_assert(!kFp8, "fp8 through the table needs AVX-512 VBMI");
#endif
  const auto step = [&](int t, bool pair) __attribute__((always_inline)) {
    __m512i vv[DC];
#pragma GCC unroll 16
    for (int c = 0; c < DC; c += kChunk) {
      const T* row = v + t * ts + d0 + c * 16;
      if constexpr (kFp8) {
#if defined(__AVX512VBMI__)
        __m512i x0[2], x1[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        Wd::load_bf16_words(row, tab, x0[0], x0[1]);
        if (pair) Wd::load_bf16_words(row + ts, tab, x1[0], x1[1]);
#pragma GCC unroll 2
        for (int w = 0; w < 2; ++w) {
          vv[c + 2 * w] = _mm512_unpacklo_epi16(x0[w], x1[w]);
          vv[c + 2 * w + 1] = _mm512_unpackhi_epi16(x0[w], x1[w]);
        }
#endif
      } else {
        const __m512i x0 = _mm512_loadu_si512(row);
        const __m512i x1 = pair ? _mm512_loadu_si512(row + ts) : _mm512_setzero_si512();
        vv[c] = _mm512_unpacklo_epi16(x0, x1);
        vv[c + 1] = _mm512_unpackhi_epi16(x0, x1);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      std::uint32_t w;  // p_t in the low half, p_t+1 (0 past the block's tokens) in the high
      std::memcpy(&w, p + r * ps + t, sizeof(w));
      const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c) {
        a[r * DC + c] = _mm512_dpbf16_ps(a[r * DC + c], pp, (__m512bh)vv[c]);
      }
    }
  };
  int t = 0;
#pragma GCC unroll 1
  for (; t + 2 <= n; t += 2) step(t, true);
  if (t < n) step(t, false);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) _mm512_storeu_ps(acc + r * D + d0 + c * 16, a[r * DC + c]);
  }
}

// The weights of R heads rounded to bf16 in place: row r's first nw floats become nw bf16 values
// at its start (each 16 floats are read before the 32 bytes they share are written).
template <int R>
inline void weights_to_bf16(float* s, int ss, int n) {
  const int nw = (n + 15) / 16 * 16;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * ss;
    for (int t = 0; t < nw; t += 16) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_load_ps(sr + t));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<bf16_t*>(sr) + t),
                          (__m256i)b);
    }
  }
}
#endif

}  // namespace
}  // namespace pagedattn::detail::cpu
