// The logits of one block for a tile of query heads: Q.K on widened K (or as bf16 dot products
// on AVX-512 BF16), then the attention variants (soft-cap, ALiBi).
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu_kernel.hpp"
#include "row_sums.hpp"
#include "tile_shape.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// s[r * ss + j] = dot(q_r, k_j) for r < R, j < TT; q_r = q + r * D, k_j = k + j * ts. Every K
// row is widened once for the R heads.
template <class Arch, int R, int TT, bool P, class T>
inline void scores_tile(const float* q, int D, const T* k, std::int64_t ts, float* s, int ss) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  constexpr int N = R * TT;
  constexpr int NR = (N + W - 1) / W * W;  // accumulators rounded up to whole RowSums groups
  B acc[NR];
#pragma GCC unroll 16
  for (int i = 0; i < NR; ++i) acc[i] = B(0.f);
  // Keeping q in registers needs R + N + 1 of them. When it fits, every FMA of one d step is
  // independent of the others (N chains interleaved), which hides the FMA latency; the
  // token-outer order below leaves only R chains in flight per token.
  constexpr int kRegs = TileShape<Arch>::kRegs;
  if constexpr (P) {
    // K widened NG batches at a time (load_group; q is in the matching order): d steps of NG W.
    constexpr int NG = kGroupBatches<Arch, T>;
#pragma GCC unroll 1
    for (int d = 0; d < D; d += NG * W) {
#pragma GCC unroll 16
      for (int j = 0; j < TT; ++j) {
        B kx[NG];
        load_group<Arch>(k + j * ts + d, kx);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
          for (int g = 0; g < NG; ++g) {
            acc[r * TT + j] =
                xsimd::fma(B::load_unaligned(q + r * D + d + g * W), kx[g], acc[r * TT + j]);
          }
        }
      }
    }
  } else if constexpr (R + N + 1 > kRegs) {
    // Many heads: token by token, so each q load feeds one FMA and folds into it.
#pragma GCC unroll 16
    for (int j = 0; j < TT; ++j) {
      const T* kj = k + j * ts;
#pragma GCC unroll 2
      for (int d = 0; d < D; d += W) {
        const B kk = Widen<Arch>::load(kj + d);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          acc[r * TT + j] = xsimd::fma(B::load_unaligned(q + r * D + d), kk, acc[r * TT + j]);
        }
      }
    }
  } else {
    // q stays in registers across the tokens of one d step.
#pragma GCC unroll 2
    for (int d = 0; d < D; d += W) {
      B qq[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) qq[r] = B::load_unaligned(q + r * D + d);
#pragma GCC unroll 16
      for (int j = 0; j < TT; ++j) {
        const B kk = Widen<Arch>::load(k + j * ts + d);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r * TT + j] = xsimd::fma(qq[r], kk, acc[r * TT + j]);
      }
    }
  }
  alignas(64) float sums[NR];
  // K widened to its values / kScale (a power of two: exact) gives the logits / kScale.
  constexpr float kScale = Widen<Arch>::template kScale<T>;
  for (int i = 0; i < NR; i += W) {
    if constexpr (kScale != 1.f) {
      (RowSums<Arch>::of(acc + i) * B(kScale)).store_aligned(sums + i);
    } else {
      RowSums<Arch>::of(acc + i).store_aligned(sums + i);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < TT; ++j) s[r * ss + j] = sums[r * TT + j];
  }
}

#if defined(__AVX512BF16__)
// s[r * ss + j] = factor * (the lane sum of acc[r * TT + j]) for r < R, j < TT: the epilogue of
// the bf16 dot-product tiles below (forced inline: it was their own code).
template <int R, int TT, int NR>
__attribute__((always_inline)) inline void store_dot_sums(const __m512 (&acc)[NR], float factor,
                                                          float* s, int ss) {
  using B = fbatch<xsimd::avx512bw>;
  alignas(64) float sums[NR];
  const B vfactor(factor);
  for (int i = 0; i < NR; i += 16) {
    (B(RowTree512<AddOp512>::of(acc + i)) * vfactor).store_aligned(sums + i);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < TT; ++j) s[r * ss + j] = sums[r * TT + j];
  }
}

// s[r * ss + j] = scale * dot(q_r, k_j) for r < R, j < TT, on raw bf16 q and K: vdpbf16ps adds
// the two exact f32 products of each pair of elements to an f32 lane (odd element first, then
// even, each rounded to nearest even, denormals flushed), 32 elements per instruction and no
// widening. D is a multiple of 16; a last half step of 16 elements loads both operands masked
// (zeros beyond: products 0, never an element of the next row).
template <int R, int TT>
inline void scores_tile_dp(const bf16_t* q, int D, const bf16_t* k, std::int64_t ts, float* s,
                           int ss, float scale) {
  constexpr int N = R * TT;
  constexpr int NR = (N + 15) / 16 * 16;
  __m512 acc[NR];
#pragma GCC unroll 16
  for (int i = 0; i < NR; ++i) acc[i] = _mm512_setzero_ps();
  const int D32 = D / 32 * 32;
#pragma GCC unroll 1
  for (int d = 0; d < D32; d += 32) {
    __m512bh qq[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) qq[r] = (__m512bh)_mm512_loadu_si512(q + r * D + d);
#pragma GCC unroll 16
    for (int j = 0; j < TT; ++j) {
      const __m512bh kk = (__m512bh)_mm512_loadu_si512(k + j * ts + d);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], qq[r], kk);
    }
  }
  if (D32 < D) {  // the last 16 elements (D = 80, 112)
    constexpr __mmask32 kHalf = 0xFFFF;
    __m512bh qq[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) qq[r] = (__m512bh)_mm512_maskz_loadu_epi16(kHalf, q + r * D + D32);
#pragma GCC unroll 16
    for (int j = 0; j < TT; ++j) {
      const __m512bh kk = (__m512bh)_mm512_maskz_loadu_epi16(kHalf, k + j * ts + D32);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], qq[r], kk);
    }
  }
  store_dot_sums<R, TT>(acc, scale, s, ss);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
// The same for an fp8 K through the bf16 table (Widen<avx512bw>::load_bf16_words), q in bf16
// word order (word_dim; copied so by run_item): every code is exact in bf16, so the products
// are as exact as for a bf16 cache. K reads as value / kScale, which the scale takes back. D is a
// multiple of 64.
template <int R, int TT, class T>
inline void scores_tile_dp_fp8(const bf16_t* q, int D, const T* k, std::int64_t ts, float* s,
                               int ss, float scale) {
  using Wd = Widen<xsimd::avx512bw>;
  constexpr int N = R * TT;
  constexpr int NR = (N + 15) / 16 * 16;
  __m512 acc[NR];
#pragma GCC unroll 16
  for (int i = 0; i < NR; ++i) acc[i] = _mm512_setzero_ps();
  const typename Wd::TableRegs tab = Wd::TableRegs::template of<T>();
  // q's two words of a 64-element step in registers when they fit next to the accumulators, the
  // table and the K words (up to 4 heads), else read at each product.
  constexpr bool kQRegs = 2 * R + N + 6 <= 32;
#pragma GCC unroll 1
  for (int d = 0; d < D; d += 64) {
    __m512bh qq[kQRegs ? 2 * R : 1];
    if constexpr (kQRegs) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        qq[2 * r] = (__m512bh)_mm512_loadu_si512(q + r * D + d);
        qq[2 * r + 1] = (__m512bh)_mm512_loadu_si512(q + r * D + d + 32);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < TT; ++j) {
      __m512i w0, w1;
      Wd::load_bf16_words(k + j * ts + d, tab, w0, w1);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if constexpr (kQRegs) {
          acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], qq[2 * r], (__m512bh)w0);
          acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], qq[2 * r + 1], (__m512bh)w1);
        } else {
          acc[r * TT + j] = _mm512_dpbf16_ps(
              acc[r * TT + j], (__m512bh)_mm512_loadu_si512(q + r * D + d), (__m512bh)w0);
          acc[r * TT + j] = _mm512_dpbf16_ps(
              acc[r * TT + j], (__m512bh)_mm512_loadu_si512(q + r * D + d + 32), (__m512bh)w1);
        }
      }
    }
  }
  store_dot_sums<R, TT>(acc, scale * Wd::kScale<T>, s, ss);
}
#endif

// Scores of TT tokens from k for R query heads at q: f32 q (pre-scaled) against widened K, or
// raw bf16 q against raw bf16 K (AVX-512 BF16), scaled after.
template <class Arch, int R, int TT, bool P, class T, class QT>
inline void scores_of(const QT* q, int D, const T* k, std::int64_t ts, float* s, int ss,
                      float scale) {
  if constexpr (std::is_same_v<QT, bf16_t>) {
#if defined(__AVX512BF16__)
    static_assert(std::is_same_v<Arch, xsimd::avx512bw>);
    if constexpr (std::is_same_v<T, bf16_t>) {
      scores_tile_dp<R, TT>(q, D, k, ts, s, ss, scale);
    } else {
#if defined(__AVX512VBMI__)
      static_assert(is_fp8_type<T> && P, "fp8 dot products through the table, in word order");
      scores_tile_dp_fp8<R, TT>(q, D, k, ts, s, ss, scale);
#else
      static_assert(std::is_same_v<T, bf16_t>, "fp8 dot products need AVX-512 VBMI");
#endif
    }
#else
    static_assert(!std::is_same_v<QT, bf16_t>, "bf16 dot products need AVX-512 BF16");
#endif
  } else {
    scores_tile<Arch, R, TT, P>(q, D, k, ts, s, ss);
  }
}

// Applies the variants to R heads' logits of one block (s[r * ss + t], t < n; the padding up to
// the next multiple of W too, which softmax_tile overwrites). A non-finite logit stays
// non-finite (tanh would make an infinite one finite), so softmax_tile still marks the head NaN.
template <class Arch, int R>
inline void transform_logits(float* s, int ss, int n, const BlockLogits& v) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  alignas(64) static constexpr float kIota[16] = {0, 1, 2,  3,  4,  5,  6,  7,
                                                  8, 9, 10, 11, 12, 13, 14, 15};
  const B iota = B::load_aligned(kIota);
  const int nw = (n + W - 1) / W * W;
  const B cap(v.cap), inv_cap(v.cap > 0.f ? 1.f / v.cap : 0.f);
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * ss;
    const B slope(v.slopes != nullptr ? v.slopes[r] : 0.f);
    for (int t = 0; t < nw; t += W) {
      const B x = B::load_aligned(sr + t);
      B y = x;
      if (v.cap > 0.f) y = cap * xsimd::tanh(x * inv_cap) + (x - x);
      if (v.slopes != nullptr)
        y = xsimd::fma(slope, B(static_cast<float>(v.first_pos + t)) + iota, y);
      y.store_aligned(sr + t);
    }
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
