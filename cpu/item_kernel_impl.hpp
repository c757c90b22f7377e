// The body of ItemKernel, included by exactly one translation unit per instruction set.
//
// Per physical block and per tile of up to eight query heads of the GQA group:
//   scores  S[r][t] = dot(q_r, k_t)          R heads x TT tokens of accumulators, reduced W at a
//                                            time by RowSums; each K row widened once per tile
//                                            (or, with AVX-512 BF16 and a bf16 q, not widened:
//                                            vdpbf16ps on the raw bf16 q and K, scaled after)
//   softmax p[r][t] = exp(S[r][t] - m_r)      vector exp over the block; acc and l rescaled only
//                                            when the block raises the running max m_r
//   values  acc_r  += sum_t p[r][t] * v_t    R heads x DC vectors of acc held in registers over
//                                            the block; each V row widened once per tile
//                                            (or, with a bf16 out on AVX-512 BF16: weights
//                                            rounded to bf16, two tokens per vdpbf16ps)
// The next physical blocks are prefetched while the current one is computed. Nothing allocates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_kernel.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/variants.hpp"
#include "row_sums.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// (block, kv head) units ahead to prefetch (see run_item), by the unit's K and V bytes.
// Fragmented tables defeat the hardware prefetcher at every block boundary; two units ahead
// covers the memory latency at one unit's compute time. Units of more than 8 KB (f32 at head dim
// 128 and block 16: 16 KB) go one ahead: two of them and the current one fill a 48 KB L1 and
// evict each other, and one ahead read f32 2-21% faster (median 7%) on one thread of an AMD Zen 5
// host, while 8 KB bf16 units read 6-16% faster two ahead (docs/performance.md).
constexpr std::int64_t kTwoAheadMaxUnitBytes = 8 * 1024;
inline int prefetch_units(std::int64_t unit_bytes) {
  return unit_bytes > kTwoAheadMaxUnitBytes ? 1 : 2;
}

template <class Arch>
struct TileShape {
  static constexpr int W = static_cast<int>(fbatch<Arch>::size);
  static constexpr int kRegs = W == 16 ? 32 : 16;
  // Tokens per scores tile for R heads: R * TT accumulators, reduced W at a time by RowSums.
  static constexpr int tokens(int R) { return R >= W ? 1 : W / R; }
  // Heads per values tile (at most 4) and vectors of head_dim per values tile: R * DC
  // accumulators + DC value vectors + 1 weight stay in registers.
  static constexpr int value_heads(int R) { return R < 4 ? R : 4; }
  static constexpr int vectors(int R) { return kRegs == 32 ? (R <= 2 ? 8 : 4) : (R <= 2 ? 4 : 2); }
};

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

// One head's weights for a block under its state: acc (ar, D floats) rescaled by alpha where
// the max grew, s[t] = exp(s[t] - shift) for t < nw (0 for the -inf padding). Returns their
// vector sum.
template <class Arch>
inline fbatch<Arch> weigh_block(float* sr, int nw, float* ar, int D, float alpha, float shift) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  if (alpha != 1.f) {  // the max grew: rescale what was accumulated under the old one
    const B va(alpha);
    for (int d = 0; d < D; d += W) (B::load_unaligned(ar + d) * va).store_unaligned(ar + d);
  }
  const B vs(shift);
  B vsum(0.f);
  for (int t = 0; t < nw; t += W) {
    const B x = B::load_aligned(sr + t);
    // exp(-inf) is 0 in xsimd, but select keeps the padding exact whatever the library does.
    const B p = xsimd::select(x == B(-INFINITY), B(0.f), xsimd::exp(x - vs));
    p.store_aligned(sr + t);
    vsum += p;
  }
  return vsum;
}

#if XSIMD_WITH_AVX512BW
// softmax_tile on AVX-512, the R heads side by side: each head's largest logit and weight sum
// come out of one transposing tree for all of them (RowTree512), and the states move as one
// vector (rescale_to of every head at once, alpha through the vector exp). Head by head, each
// reduction was a chain of shuffles, a scalar compare and a scalar exp that the next step waited
// on; at group 8 that took a fifth of the kernel's time in cache.
template <int R>
inline void softmax_heads_512(float* s, int ss, int n, float* m, float* l, float* acc, int D) {
  static_assert(R >= 1 && R <= 16, "one lane per head");
  using B = fbatch<xsimd::avx512bw>;
  constexpr int W = 16;
  const int nw = (n + W - 1) / W * W;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 rows[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) rows[r] = ninf;
  // A NaN or infinite logit (NaN or Inf in q or in a K row) makes the head's result NaN, as does
  // a state that is NaN already: its m = l = NaN, acc = NaN, weights 0.
  unsigned bad = 0;
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * ss;
    __mmask16 nonfinite = 0;
    __m512 vmax = ninf;
    for (int t = 0; t < nw; t += W) {
      __m512 x = _mm512_load_ps(sr + t);
      if (t + W > n) {  // past the block's tokens: -inf, a weight of 0
        const __mmask16 valid = static_cast<__mmask16>((1u << (n - t)) - 1);
        x = _mm512_mask_mov_ps(ninf, valid, x);
        _mm512_store_ps(sr + t, x);
        nonfinite |= _mm512_mask_fpclass_ps_mask(valid, x, 0x99);  // NaN or +-Inf
      } else {
        nonfinite |= _mm512_fpclass_ps_mask(x, 0x99);
      }
      vmax = _mm512_max_ps(vmax, x);
    }
    rows[r] = vmax;
    if (nonfinite != 0 || l[r] != l[r]) bad |= 1u << r;
  }
  const __mmask16 lanes = static_cast<__mmask16>((1u << R) - 1);
  const __m512 tile_max = RowTree512<MaxOp512>::of(rows);
  __m512 vm = _mm512_mask_loadu_ps(ninf, lanes, m);
  __m512 vl = _mm512_maskz_loadu_ps(lanes, l);
  // OnlineSoftmax::rescale_to for every head: where the tile raises the max, l *= alpha =
  // exp(m - tile_max) (1 while the state is empty) and m = tile_max.
  const __mmask16 grows = _mm512_cmp_ps_mask(tile_max, vm, _CMP_GT_OQ);
  const __mmask16 rescale = grows & ~_mm512_cmp_ps_mask(vm, ninf, _CMP_EQ_OQ);
  __m512 alpha = _mm512_set1_ps(1.f);
  if (rescale != 0) {
    const __m512 e = xsimd::exp(B(_mm512_sub_ps(vm, tile_max)));
    alpha = _mm512_mask_mov_ps(alpha, rescale, e);
    vl = _mm512_mask_mul_ps(vl, rescale, vl, alpha);
  }
  vm = _mm512_mask_mov_ps(vm, grows, tile_max);
  // The shift of the logits: the running max, 0 while it is -inf (OnlineSoftmax::shift).
  const __m512 shift =
      _mm512_mask_mov_ps(vm, _mm512_cmp_ps_mask(vm, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
  alignas(64) float alphas[16], shifts[16], maxes[16];
  _mm512_store_ps(alphas, alpha);
  _mm512_store_ps(shifts, shift);
  _mm512_store_ps(maxes, vm);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) rows[r] = _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * ss;
    if ((bad >> r & 1u) != 0 || maxes[r] == -INFINITY) {
      // NaN state, or no finite logit yet (every weight 0, the state stays empty).
      if ((bad >> r & 1u) != 0) std::fill(acc + r * D, acc + (r + 1) * D, NAN);
      for (int t = 0; t < nw; t += W) _mm512_store_ps(sr + t, _mm512_setzero_ps());
      continue;
    }
    rows[r] = weigh_block<xsimd::avx512bw>(sr, nw, acc + r * D, D, alphas[r], shifts[r]);
  }
  vl = _mm512_add_ps(vl, RowTree512<AddOp512>::of(rows));
  _mm512_mask_storeu_ps(m, lanes, vm);
  _mm512_mask_storeu_ps(l, lanes, vl);
  for (int r = 0; r < R; ++r) {
    if ((bad >> r & 1u) != 0) m[r] = l[r] = NAN;
  }
}
#endif

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

// Folds one block's n logits per head (s[r * ss + t], t < n) into the states of R heads. On
// return s holds the weights p = exp(s - m_new), zero from n up to the next multiple of W. The
// state update (rescale_to, add) is SoftmaxState's; only the vector max and exp are done here
// (on AVX-512 softmax_heads_512 does the same update for all R heads at once).
template <class Arch, int R>
inline void softmax_tile(float* s, int ss, int n, float* m, float* l, float* acc, int D) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  const int nw = (n + W - 1) / W * W;
#if XSIMD_WITH_AVX512BW
  // From 4 heads on: the trees cost as much for one head as for 16 (about 90 instructions),
  // which one head's two lane reductions below (about 20) do not.
  if constexpr (std::is_same_v<Arch, xsimd::avx512bw> && R >= 4) {
    softmax_heads_512<R>(s, ss, n, m, l, acc, D);
    return;
  }
#endif
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * ss;
    // A NaN or infinite logit (NaN or Inf in q or in a K row) makes the head's result NaN: the
    // state becomes NaN (m = l = NaN, acc = NaN) and stays so; its weights are 0. x - x is 0 for
    // a finite x and NaN otherwise, so one sum over the valid logits tells.
    B vbad(0.f);
    int t0 = 0;
    for (; t0 + W <= n; t0 += W) {
      const B x = B::load_aligned(sr + t0);
      vbad += x - x;
    }
    float bad = xsimd::hadd(vbad);
    for (; t0 < n; ++t0) bad += sr[t0] - sr[t0];
    if (bad != 0.f || l[r] != l[r]) {
      m[r] = l[r] = NAN;
      std::fill(acc + r * D, acc + (r + 1) * D, NAN);
      for (int t = 0; t < nw; ++t) sr[t] = 0.f;
      continue;
    }
    for (int t = n; t < nw; ++t) sr[t] = -INFINITY;
    B vmax(-INFINITY);
    for (int t = 0; t < nw; t += W) vmax = xsimd::max(vmax, B::load_aligned(sr + t));
    const float tile_max = LaneReduce<Arch>::max(vmax);
    SoftmaxState st{m[r], l[r]};
    const float alpha = st.rescale_to(tile_max);
    if (st.m == -INFINITY) {  // no finite logit yet: every weight is 0, the state stays empty
      for (int t = 0; t < nw; ++t) sr[t] = 0.f;
      continue;
    }
    const B vsum = weigh_block<Arch>(sr, nw, acc + r * D, D, alpha, st.shift());
    st.add(LaneReduce<Arch>::sum(vsum));
    m[r] = st.m;
    l[r] = st.l;
  }
}

// Prefetches one later block (its K and V rows) a few cache lines at a time, interleaved with
// the compute of the current block. Issuing a whole block's lines at once fills the core's miss
// buffers, and the burst then stalls the kernel until memory catches up: compute and memory
// time add up instead of overlapping. It changes its own state, so GCC keeps the calls. Forced
// inline: where a translation unit grew (the AVX-512 BF16 kernel with the fp8 table path) GCC
// stopped inlining advance(), and a one-thread bf16 decode streaming from memory took 2.2x as long
// (8 x 32 x 8 x 2048 tokens on Zen 5: 6.6 against 3.0 ms), though it ran as fast in cache.
struct PacedPrefetch {
  const char* k = nullptr;
  const char* v = nullptr;
  std::int64_t stride = 0;                     // bytes between rows (0: one contiguous span)
  std::int64_t row_off = 0;                    // the current row's offset
  std::int64_t done = 0, total = 0, step = 0;  // in lines
  int row_lines = 0, col = 0;

  // `rows` rows of row_bytes, stride_bytes apart. Rows close together (the HND layout: a kv
  // head's slots are adjacent) are one span; rows far apart (NHD: the other kv heads sit between
  // them) are fetched row by row, so the lines between them are not fetched.
  void start(const void* kb, const void* vb, int rows, std::int64_t row_bytes,
             std::int64_t stride_bytes, int pieces) {
    k = static_cast<const char*>(kb);
    v = static_cast<const char*>(vb);
    row_off = 0;
    done = 0;
    col = 0;
    if (rows <= 0) {
      total = 0;
      return;
    }
    if (stride_bytes <= row_bytes + 64) {
      stride = 0;
      row_lines = static_cast<int>(((rows - 1) * stride_bytes + row_bytes + 63) / 64);
      total = row_lines;
    } else {
      stride = stride_bytes;
      // A row that does not start on a line touches one line more.
      row_lines = static_cast<int>((row_bytes + 63) / 64) + (stride_bytes % 64 != 0);
      total = static_cast<std::int64_t>(rows) * row_lines;
    }
    step = std::max<std::int64_t>(1, (total + pieces - 1) / pieces);
  }
  // The next piece (step lines of K and of V).
  __attribute__((always_inline)) void piece() { advance(std::min(done + step, total)); }
  // Whatever is left.
  __attribute__((always_inline)) void rest() { advance(total); }

 private:
  __attribute__((always_inline)) void advance(std::int64_t end) {
    for (; done < end; ++done) {
      const std::int64_t at = row_off + static_cast<std::int64_t>(col) * 64;
      __builtin_prefetch(k + at, 0, 3);
      __builtin_prefetch(v + at, 0, 3);
      if (++col == row_lines) {
        col = 0;
        row_off += stride;
      }
    }
  }
};

// Pieces one unit's prefetch is cut into: about one per scores or values tile of a 16-token
// block, so the lines go out spread over the unit's compute.
constexpr int kPrefetchPieces = 16;

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

// One block of n tokens (k, v: its first slot) for R query heads starting at q.
template <class Arch, int R, bool P, bool PW, class T, class QT>
inline void block_tile(const QT* q, const T* k, const T* v, std::int64_t ts, int n, int D,
                       float scale, const BlockLogits& var, float* s, int ss, float* m, float* l,
                       float* acc, PacedPrefetch& pf) {
  using Shape = TileShape<Arch>;
  constexpr int W = Shape::W;
  constexpr int TT = Shape::tokens(R);
  // fp8 V through f16 costs several instructions per widened batch: with 32 registers an 8-head
  // tile (two vectors of head_dim per head, 16 accumulators) widens each V row once instead of
  // twice. Quads (the table, about half the instructions) need four vectors per tile.
  constexpr bool kQuadV = P && kGroupBatches<Arch, T> == 4;
  constexpr bool kWideV = is_fp8_type<T> && Shape::kRegs == 32 && R == 8 && !kQuadV;
  constexpr int RV = kWideV ? 8 : Shape::value_heads(R);
  constexpr int DC = kWideV ? 2 : Shape::vectors(RV);
  static_assert(R % RV == 0, "values tiles cover the scores tile");
  int t = 0;
  for (; t + TT <= n; t += TT) {
    pf.piece();
    scores_of<Arch, R, TT, P>(q, D, k + t * ts, ts, s + t, ss, scale);
  }
  for (; t < n; ++t) scores_of<Arch, R, 1, P>(q, D, k + t * ts, ts, s + t, ss, scale);
  if (var.active()) transform_logits<Arch, R>(s, ss, n, var);
  softmax_tile<Arch, R>(s, ss, n, m, l, acc, D);
#if defined(__AVX512BF16__)
  if constexpr (PW) {
    static_assert((std::is_same_v<T, bf16_t> || kQuadV) && P, "bf16 words of V");
    weights_to_bf16<R>(s, ss, n);
    for (int r = 0; r < R; r += RV) {
      const bf16_t* p = reinterpret_cast<const bf16_t*>(s + r * ss);
      float* a = acc + static_cast<std::int64_t>(r) * D;
      int d = 0;
      for (; d + DC * W <= D; d += DC * W) {
        pf.piece();
        values_tile_dp<RV, DC>(p, 2 * ss, v, ts, n, a, D, d);
      }
      // The rest by chunks: 32 elements of a bf16 cache (D a multiple of 32), 64 fp8 codes.
      constexpr int kChunk = is_fp8_type<T> ? 4 : 2;
      for (; d < D; d += kChunk * W) values_tile_dp<RV, kChunk>(p, 2 * ss, v, ts, n, a, D, d);
    }
    return;
  }
#else
  static_assert(!PW, "bf16 weights need AVX-512 BF16");
#endif
  for (int r = 0; r < R; r += RV) {
    const float* p = s + r * ss;
    float* a = acc + static_cast<std::int64_t>(r) * D;
    int d = 0;
    for (; d + DC * W <= D; d += DC * W) {
      pf.piece();
      values_tile<Arch, RV, DC, P>(p, ss, v, ts, n, a, D, d);
    }
    if constexpr (P) {  // D is a multiple of NG W here
      constexpr int NG = kGroupBatches<Arch, T>;
      for (; d < D; d += NG * W) values_tile<Arch, RV, NG, P>(p, ss, v, ts, n, a, D, d);
    } else {
      for (; d < D; d += W) values_tile<Arch, RV, 1, P>(p, ss, v, ts, n, a, D, d);
    }
  }
}

// Folds the blocks of `it` for kv heads [it.kv_head, it.kv_head + kv_count) into their states
// (m, l: kv_count * G entries; acc: kv_count * G rows of D). Block by block, every kv head of the
// range in turn: in the [block][kv head][slot][dim] layout this walks one contiguous stretch of
// K and of V per block (kv_count x 4 KB for bf16, D = 128, block 16) instead of one 4 KB piece
// per kv head at a random place, which the memory system serves much faster.
template <class Arch, class T, bool P, bool PW = false, class QT>
void run_item(const ItemContext& c, const WorkItem& it, int kv_count, const QT* q_heads, float* m,
              float* l, float* acc, ItemScratch scratch) {
  const int D = c.layout.head_dim, BS = c.layout.block_size, G = c.group_size;
  const std::int64_t ts = c.layout.token_stride;
  const int L = c.context_lens[it.seq];
  const T* k_cache = static_cast<const T*>(c.k_cache);
  const T* v_cache = static_cast<const T*>(c.v_cache);
  const int ss = scores_stride(BS);
  float* s = scratch.scores;  // [kHeadTile][ss]: logits, then weights
  const int kv_first = it.kv_head, kv_last = it.kv_head + kv_count - 1;
  const int heads = kv_count * G;

  for (int g = 0; g < heads; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + static_cast<std::int64_t>(heads) * D, 0.f);

  // The item's (block, kv head) units in compute order: unit u is kv head kv_first + u % kv_count
  // of logical block block_begin + u / kv_count, its valid rows of K and of V. Units [0, ahead)
  // are prefetched at once (nothing to overlap with yet); then, while unit u is computed, unit
  // u + ahead is prefetched in pieces. A short distance in units keeps the prefetched lines in L1
  // until they are used; the hardware prefetcher follows the contiguous stretch of several kv
  // heads beyond it. Never past the item: table entries past the context may be garbage.
  const int units = (it.block_end - it.block_begin) * kv_count;
  const int ahead = prefetch_units(2 * static_cast<std::int64_t>(BS) * D * sizeof(T));
  auto start_unit = [&](PacedPrefetch& p, int u, int pieces) {
    if (u >= units) {
      p.start(nullptr, nullptr, 0, 0, 0, 1);
      return;
    }
    const int b = it.block_begin + u / kv_count;
    const std::int64_t base = c.layout.offset(c.table.block(it.seq, b), kv_first + u % kv_count, 0);
    constexpr std::int64_t kElem = sizeof(T);
    p.start(k_cache + base, v_cache + base, valid_in_block(L, BS, b), D * kElem, ts * kElem,
            pieces);
  };
  PacedPrefetch pf;
  for (int u = 0; u < std::min(units, ahead); ++u) {
    start_unit(pf, u, 1);
    pf.rest();
  }
  // With a window, the tokens of the first block before it are skipped (never computed).
  const int first_tok = window_first_token(L, c.window_left);
  for (int blk = it.block_begin; blk < it.block_end; ++blk) {
    const int id = c.table.block(it.seq, blk);
    const int skip = std::max(0, first_tok - blk * BS);
    const int n = valid_in_block(L, BS, blk) - skip;
    BlockLogits var;
    var.cap = c.soft_cap;
    var.first_pos = blk * BS + skip - (L - 1);
    for (int i = 0; i < kv_count; ++i) {
      pf.rest();
      start_unit(pf, (blk - it.block_begin) * kv_count + i + ahead, kPrefetchPieces);
      const int kv = kv_first + i;
      // The factor of the dot products of a raw bf16 q (q_scaled has it in): an fp8 cache's K
      // scale joins the softmax scale.
      const float logit_scale =
          is_fp8_type<T> ? c.scale * head_scale(c.k_scale, c.k_scales, kv) : c.scale;
      const std::int64_t base = c.layout.offset(id, kv, skip);
      const T* kb = k_cache + base;
      const T* vb = v_cache + base;
      const QT* q = q_heads + static_cast<std::int64_t>(i) * G * D;
      float* mi = m + i * G;
      float* li = l + i * G;
      float* ai = acc + static_cast<std::int64_t>(i) * G * D;
      for (int g = 0; g < G;) {
        const QT* qg = q + static_cast<std::int64_t>(g) * D;
        float* ag = ai + static_cast<std::int64_t>(g) * D;
        // Tiles of 8 heads, then 4, then the rest (1 to 3). With 16 registers an 8-head tile
        // cannot keep q in registers (see scores_tile), so two 4-head tiles run faster there.
        const int rest = G - g;
        const int R = rest >= 8 && TileShape<Arch>::kRegs == 32 ? 8 : rest >= 4 ? 4 : rest;
        if (c.alibi_slopes != nullptr) var.slopes = c.alibi_slopes + kv * G + g;
        switch (R) {
          case 8:
            block_tile<Arch, 8, P, PW>(qg, kb, vb, ts, n, D, logit_scale, var, s, ss, mi + g,
                                       li + g, ag, pf);
            break;
          case 4:
            block_tile<Arch, 4, P, PW>(qg, kb, vb, ts, n, D, logit_scale, var, s, ss, mi + g,
                                       li + g, ag, pf);
            break;
          case 3:
            block_tile<Arch, 3, P, PW>(qg, kb, vb, ts, n, D, logit_scale, var, s, ss, mi + g,
                                       li + g, ag, pf);
            break;
          case 2:
            block_tile<Arch, 2, P, PW>(qg, kb, vb, ts, n, D, logit_scale, var, s, ss, mi + g,
                                       li + g, ag, pf);
            break;
          default:
            block_tile<Arch, 1, P, PW>(qg, kb, vb, ts, n, D, logit_scale, var, s, ss, mi + g,
                                       li + g, ag, pf);
            break;
        }
        g += R;
      }
    }
  }
  pf.rest();
  // V widened to its values / kScale: the weighted sums too (the softmax's rescaling and NaN do
  // not depend on it).
  constexpr float kScale = Widen<Arch>::template kScale<T>;
  if constexpr (kScale != 1.f) {
    const std::int64_t n = static_cast<std::int64_t>(heads) * D;
    for (std::int64_t i = 0; i < n; ++i) acc[i] *= kScale;
  }
}

// bf16 word order (word_dim in widen.hpp) and quad order (quad_dim), per chunk of 64 elements: a
// bf16 q is copied into the first, the accumulators run in the second and are put back at the
// end.
inline void to_word_order(const bf16_t* in, bf16_t* out, int D) {
  for (int c = 0; c < D; c += 64) {
    for (int w = 0; w < 2; ++w) {
      for (int n = 0; n < 32; ++n) out[c + 32 * w + n] = in[c + word_dim(w, n)];
    }
  }
}
inline void from_quad_order(float* row, float* tmp, int D) {
  for (int c = 0; c < D; c += 64) {
    for (int m = 0; m < 4; ++m) {
      for (int k = 0; k < 16; ++k) tmp[quad_dim(m, k)] = row[c + 16 * m + k];
    }
    std::copy(tmp, tmp + 64, row + c);
  }
}

// Pair order (see load_pair in widen.hpp): in every chunk of 2W elements, the even ones, then the
// odd ones. q is copied into it, the accumulators run in it and are put back in order at the end.
template <int W>
void to_pair_order(const float* in, float* out, int D) {
  for (int c = 0; c < D; c += 2 * W) {
    for (int i = 0; i < W; ++i) {
      out[c + i] = in[c + 2 * i];
      out[c + W + i] = in[c + 2 * i + 1];
    }
  }
}
template <int W>
void from_pair_order(float* row, float* tmp, int D) {
  for (int c = 0; c < D; c += 2 * W) {
    for (int i = 0; i < W; ++i) {
      tmp[2 * i] = row[c + i];
      tmp[2 * i + 1] = row[c + W + i];
    }
    std::copy(tmp, tmp + 2 * W, row + c);
  }
}

// Token-pair order (values_tile_dp): output vector 2 w + h of a chunk, lane j, holds word
// 8 (j / 4) + 4 h + j % 4 of word vector w: element 32 w + that word of a bf16 cache's chunk (32
// elements each, so w = 0), word_dim(w, that word) of an fp8 chunk (64 codes).
template <bool kFp8>
void from_token_pair_order(float* row, float* tmp, int D) {
  constexpr int kChunk = kFp8 ? 64 : 32;
  for (int c = 0; c < D; c += kChunk) {
    for (int o = 0; o < kChunk / 16; ++o) {
      const int w = o / 2, h = o % 2;
      for (int j = 0; j < 16; ++j) {
        const int word = 8 * (j / 4) + 4 * h + j % 4;
        tmp[kFp8 ? word_dim(w, word) : 32 * w + word] = row[c + 16 * o + j];
      }
    }
    std::copy(tmp, tmp + kChunk, row + c);
  }
}

// One task: the item's blocks for kv_count kv heads. DP: Q.K as bf16 dot products on the raw
// bf16 q (c.q_bf16; AVX-512 BF16 with a bf16 cache, or an fp8 one through the table of AVX-512
// VBMI, in quads), otherwise on the scaled f32 q. Where the set widens T in pairs or quads, the
// accumulators run in pair or quad order and are put back in order at the end; the f32 q is
// copied into pair order too (into scratch.q: without it, the plain widening), the bf16 q of fp8
// dot products into word order. Where it widens T two batches at a time in order (e4m3 on AVX2
// and AVX-512 without VBMI), only head_dim must be a multiple of 2W.
template <class Arch, class T, bool DP = false>
void run_item(const ItemContext& c, const WorkItem& it, int kv_count, float* m, float* l,
              float* acc, ItemScratch scratch) {
  constexpr int W = static_cast<int>(fbatch<Arch>::size);
  const int D = c.layout.head_dim;
  const int heads = kv_count * c.group_size;
  const std::int64_t head0 = static_cast<std::int64_t>(it.kv_head) * c.group_size * D;
  const std::int64_t q0 = static_cast<std::int64_t>(it.seq) * c.num_heads * D + head0;
  const auto from_pairs = [&] {
    alignas(64) float tmp[2 * W];
    for (int h = 0; h < heads; ++h)
      from_pair_order<W>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
  };
  // Quads: 4W = 64 elements per widening, so head_dim a multiple of 64 (64, 128, 192, 256).
  const bool quads = Widen<Arch>::template kQuads<T> && scratch.q != nullptr && D % (4 * W) == 0;
  const auto from_quads = [&] {
    alignas(64) float tmp[64];
    for (int h = 0; h < heads; ++h) from_quad_order(acc + static_cast<std::int64_t>(h) * D, tmp, D);
  };
  // After P.V on bf16 weights (values_tile_dp): 32-element chunks of a bf16 cache, 64 of fp8.
  const auto from_token_pairs = [&] {
    alignas(64) float tmp[64];
    for (int h = 0; h < heads; ++h) {
      from_token_pair_order<is_fp8_type<T>>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
    }
  };
  if constexpr (DP) {
    const bf16_t* q = c.q_bf16 + it.seq * c.q_bf16_stride + head0;
    if constexpr (is_fp8_type<T>) {
      // Through the table at head dims that are multiples of 64 (with the q buffer); else the
      // AVX-512 kernel (isa_avx512.cpp: the f16 widening, e4m3 two batches at a time).
      if (!quads) return ItemKernel{}(Arch{}, c, it, kv_count, m, l, acc, scratch);
      bf16_t* qw = reinterpret_cast<bf16_t*>(scratch.q);
      for (int h = 0; h < heads; ++h) {
        to_word_order(q + static_cast<std::int64_t>(h) * D, qw + static_cast<std::int64_t>(h) * D,
                      D);
      }
      if (c.bf16_weights) {  // P.V on vdpbf16ps too (a bf16 out)
        run_item<Arch, T, true, true>(c, it, kv_count, static_cast<const bf16_t*>(qw), m, l, acc,
                                      scratch);
        from_token_pairs();
        return;
      }
      run_item<Arch, T, true>(c, it, kv_count, static_cast<const bf16_t*>(qw), m, l, acc, scratch);
      from_quads();
    } else {
#if defined(__AVX512BF16__)
      // P.V on vdpbf16ps too where the weights may be rounded to bf16 (a bf16 out).
      if (c.bf16_weights && D % 32 == 0) {
        run_item<Arch, T, true, true>(c, it, kv_count, q, m, l, acc, scratch);
        from_token_pairs();
        return;
      }
#endif
      if constexpr (Widen<Arch>::template kPairs<T>) {
        if (D % (2 * W) == 0) {
          run_item<Arch, T, true>(c, it, kv_count, q, m, l, acc, scratch);
          from_pairs();
          return;
        }
      }
      run_item<Arch, T, false>(c, it, kv_count, q, m, l, acc, scratch);
    }
  } else {
    const float* q = c.q_scaled + q0;
    if constexpr (Widen<Arch>::template kTwo<T>) {
      // Two batches per widening, in order: q and the accumulators stay as they are.
      if (D % (2 * W) == 0) {
        run_item<Arch, T, true>(c, it, kv_count, q, m, l, acc, scratch);
        return;
      }
    }
    if constexpr (Widen<Arch>::template kPairs<T>) {
      if (scratch.q != nullptr && D % (2 * W) == 0) {
        for (int h = 0; h < heads; ++h) {
          to_pair_order<W>(q + static_cast<std::int64_t>(h) * D, scratch.q + h * D, D);
        }
        run_item<Arch, T, true>(c, it, kv_count, scratch.q, m, l, acc, scratch);
        from_pairs();
        return;
      }
    }
    run_item<Arch, T, false>(c, it, kv_count, q, m, l, acc, scratch);
  }
}

}  // namespace

template <class Arch>
void ItemKernel::operator()(Arch, const ItemContext& ctx, const WorkItem& item, int kv_count,
                            float* m, float* l, float* acc, ItemScratch scratch) const {
  switch (ctx.kv_dtype) {
    case DType::kF32:
      run_item<Arch, float>(ctx, item, kv_count, m, l, acc, scratch);
      break;
    case DType::kF16:
      run_item<Arch, f16_t>(ctx, item, kv_count, m, l, acc, scratch);
      break;
    case DType::kBF16:
      run_item<Arch, bf16_t>(ctx, item, kv_count, m, l, acc, scratch);
      break;
    case DType::kFP8E4M3:
      run_item<Arch, fp8_e4m3_t>(ctx, item, kv_count, m, l, acc, scratch);
      break;
    case DType::kFP8E5M2:
      run_item<Arch, fp8_e5m2_t>(ctx, item, kv_count, m, l, acc, scratch);
      break;
  }
}

template <class Arch>
void ItemKernel::operator()(Arch, const ItemContext& ctx, const WorkItem& item, float* m, float* l,
                            float* acc, ItemScratch scratch) const {
  (*this)(Arch{}, ctx, item, 1, m, l, acc, scratch);
}

}  // namespace pagedattn::detail::cpu
