// One block's logits folded into the running softmax states of a tile of query heads: the
// weights exp(s - m), the rescaled accumulators and the sums (OnlineSoftmax's update, vectorized).
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "pagedattn/online_softmax.hpp"
#include "row_sums.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

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
// reduction is a chain of shuffles, a scalar compare and a scalar exp that the next step waits on
// (docs/cpu.md has what that cost).
template <int R>
inline void softmax_heads_512(float* s, int ss, int n, const int* rows_n, float* m, float* l,
                              float* acc, int D) {
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
    const int nr = rows_n != nullptr ? rows_n[r] : n;  // the head's tokens: a prefix of the block
    __mmask16 nonfinite = 0;
    __m512 vmax = ninf;
    for (int t = 0; t < nw; t += W) {
      __m512 x = _mm512_load_ps(sr + t);
      if (t + W > nr) {  // past the head's tokens: -inf, a weight of 0
        const __mmask16 valid = static_cast<__mmask16>(nr > t ? (1u << (nr - t)) - 1 : 0u);
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

// Folds one block's n logits per head (s[r * ss + t], t < n) into the states of R heads; with
// rows_n, head r takes only its first rows_n[r] <= n logits (the tokens before its causal bound,
// when a sequence's query tokens share the tile) and the rest count as padding, their values
// never looked at. On return s holds the weights p = exp(s - m_new), zero from a head's count up
// to the next multiple of W past n. The state update (rescale_to, add) is SoftmaxState's; only
// the vector max and exp are done here (on AVX-512 softmax_heads_512 does the same update for all
// R heads at once).
template <class Arch, int R>
inline void softmax_tile(float* s, int ss, int n, const int* rows_n, float* m, float* l, float* acc,
                         int D) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  const int nw = (n + W - 1) / W * W;
#if XSIMD_WITH_AVX512BW
  // From 4 heads on: the trees cost as much for one head as for 16 (about 90 instructions),
  // which one head's two lane reductions below (about 20) do not.
  if constexpr (std::is_same_v<Arch, xsimd::avx512bw> && R >= 4) {
    softmax_heads_512<R>(s, ss, n, rows_n, m, l, acc, D);
    return;
  }
#endif
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * ss;
    const int nr = rows_n != nullptr ? rows_n[r] : n;  // the head's tokens: a prefix of the block
    // A NaN or infinite logit (NaN or Inf in q or in a K row) makes the head's result NaN: the
    // state becomes NaN (m = l = NaN, acc = NaN) and stays so; its weights are 0. x - x is 0 for
    // a finite x and NaN otherwise, so one sum over the valid logits tells.
    B vbad(0.f);
    int t0 = 0;
    for (; t0 + W <= nr; t0 += W) {
      const B x = B::load_aligned(sr + t0);
      vbad += x - x;
    }
    float bad = xsimd::hadd(vbad);
    for (; t0 < nr; ++t0) bad += sr[t0] - sr[t0];
    if (bad != 0.f || l[r] != l[r]) {
      m[r] = l[r] = NAN;
      std::fill(acc + r * D, acc + (r + 1) * D, NAN);
      for (int t = 0; t < nw; ++t) sr[t] = 0.f;
      continue;
    }
    for (int t = nr; t < nw; ++t) sr[t] = -INFINITY;
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

}  // namespace
}  // namespace pagedattn::detail::cpu
