// A task on AMX in steps of 32 tokens (isa_amx.cpp): where the tiles hold 16 query heads and the
// weights may be rounded to bf16, the blocks of a kv head are taken 32 tokens at a time (two
// blocks of 16, four of 8, ...). Each step's logits come out of the scores tiles token-major (one
// 64-byte row of 16 heads per token) and stay so for the softmax, which then works on all 16
// heads at once, one vector per token; the weights are rounded to bf16 in token pairs and
// transposed once into a 16 heads x 32 tokens P tile, and P.V runs as one full-depth
// _tile_dpbf16ps per 16 head dims, the accumulators loaded and stored once per step. V is
// interleaved in token pairs once per step and kv head for all its tiles of heads.
// Part of the AMX kernel, included only by isa_amx.cpp: internal linkage keeps its code apart.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx_tiles.hpp"
#include "block_values.hpp"
#include "cpu_kernel.hpp"
#include "paced_prefetch.hpp"
#include "pagedattn/variants.hpp"
#include "widen.hpp"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

namespace pagedattn::detail::cpu {
namespace {

constexpr int kAmxStepTokens = 32;   // a step's tokens: the depth of one bf16 P tile
constexpr int kAmxStepMaxDim = 256;  // the largest head dim the step buffers hold

// Whether a task takes the steps of 32 tokens: bf16 weights (a bf16 out), tiles of 16 heads,
// blocks of at most 32 tokens (a step is whole blocks) and no tree mask (a step reads every token
// of its blocks).
inline bool amx_steps_take(const ItemContext& c) {
  return c.bf16_weights && c.tree_rows == nullptr && c.tree_mask == nullptr &&
         amx_tile_heads(c.group_size) == kAmxWideHeads && c.layout.block_size <= kAmxStepTokens &&
         c.layout.head_dim <= kAmxStepMaxDim;
}

// Every tile 16 rows of 64 bytes: the C, K and q tiles of the scores (16 tokens x 16 heads, 16
// tokens x 32 dims, 16 dim pairs x 16 heads), the P tile (16 heads x 32 tokens), V (16 token pairs
// x 16 dims) and the accumulators (16 heads x 16 dims), so the registers change roles freely:
// scores use tmm0-1 and tmm5-6 (C), tmm2 (K) and tmm3-4 (q); P.V tmm0-1 (P), tmm2-3 (V)
// and tmm4-7 (accumulators).
inline void amx_configure_step_tiles() {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// The rows of one step for one kv head: token j (j < n) of the step is K row k[j] and V row v[j],
// position p0 + j; seg[j] numbers the block piece it lies in (rows of one piece are ts apart).
struct AmxStep {
  int n = 0;
  int p0 = 0;
  std::int64_t ts = 0;
  const bf16_t* k[kAmxStepTokens];
  const bf16_t* v[kAmxStepTokens];
  std::uint8_t seg[kAmxStepTokens];
};

// The step's buffers, on the task's stack (40 KB). pw is zeroed once per task and then only ever
// holds weights: amx_step_values_rest pairs a head's odd last token with the next word, which
// must be finite (it multiplies a zero), and for the last head of the last tile that is pw_end.
struct AmxStepBuffers {
  alignas(64) float sc[2][kAmxStepTokens][16];   // logits, token-major, per head tile
  alignas(64) bf16_t pw[2][16][kAmxStepTokens];  // P tiles, per head tile
  bf16_t pw_end[kAmxStepTokens];
  // V in token pairs: per 16 dims, the step's token pairs x 16 dims.
  alignas(64) bf16_t vp[kAmxStepMaxDim / 16][kAmxStepTokens / 2][32];
  alignas(64) bf16_t part[2][16][kAmxStepMaxDim];  // K rows of 16 tokens not in one piece
};

// Unit by unit prefetch for a step: the units (block, kv head) of a step are started one after the
// other, each paced over its share of the step's tile calls.
template <class Start>
struct AmxStepPrefetch {
  PacedPrefetch pf;
  Start start;
  int next = 0, end = 0, pieces = 1;
  __attribute__((always_inline)) void piece() {
    if (pf.done >= pf.total && next < end) start(pf, next++, pieces);
    pf.piece();
  }
  // Finishes the units still due, then takes units [first, first + count) in `p` pieces each.
  void due(int first, int count, int p) {
    finish();
    next = first;
    end = first + count;
    pieces = p;
  }
  void finish() {
    pf.rest();
    for (; next < end; ++next) {
      start(pf, next, 1);
      pf.rest();
    }
  }
};

// The logits of NT (1 or 2) tiles of 16 heads for the step's tokens: b.sc[j][t][h] =
// dot(q_h, k_t) (unscaled) for t < st.n, token-major as the C tile stores them. Both 16-token
// halves of the step run together, so each q tile is loaded once per 32 dims for both (C tiles:
// tmm0-1 for the first half, tmm5-6 for the second; K tmm2, q tmm3-4). A half that lies in one
// piece loads K straight from the cache; another (smaller blocks, the last tokens) copies its rows
// into b.part first, so no row outside the step is read. q: the first tile's packed B
// (amx_pack_q), the second's 16 D words on.
template <int NT, class Prefetch>
inline void amx_step_scores(const AmxQWord* q, int D, const AmxStep& st, AmxStepBuffers& b,
                            Prefetch& pf) {
  static_assert(kAmxStepTokens == 2 * kAmxTokens, "two halves of 16 tokens");
  const bf16_t* kt[2];
  std::int64_t k_stride[2];
  for (int half = 0; half < 2; ++half) {
    const int t0 = half * kAmxTokens;
    const int rows = std::clamp(st.n - t0, 0, kAmxTokens);
    if (rows == kAmxTokens && st.seg[t0] == st.seg[t0 + kAmxTokens - 1]) {
      kt[half] = st.k[t0];
      k_stride[half] = st.ts * static_cast<std::int64_t>(sizeof(bf16_t));
    } else if (rows > 0) {
      bf16_t(*part)[kAmxStepMaxDim] = b.part[half];
      for (int t = 0; t < rows; ++t) std::memcpy(part[t], st.k[t0 + t], D * sizeof(bf16_t));
      for (int t = rows; t < kAmxTokens; ++t) std::memset(part[t], 0, D * sizeof(bf16_t));
      kt[half] = part[0];
      k_stride[half] = sizeof(part[0]);
    }
  }
  const bool two = st.n > kAmxTokens;
  _tile_zero(0);
  if constexpr (NT == 2) _tile_zero(1);
  if (two) {
    _tile_zero(5);
    if constexpr (NT == 2) _tile_zero(6);
  }
  for (int d = 0; d < D; d += kAmxDims) {
    pf.piece();
    const AmxQWord* qd = q + (d / kAmxDims) * kAmxDims * kAmxWideHeads;
    _tile_loadd(3, qd, 64);
    if constexpr (NT == 2) _tile_loadd(4, qd + static_cast<std::int64_t>(kAmxWideHeads) * D, 64);
    _tile_loadd(2, kt[0] + d, k_stride[0]);
    _tile_dpbf16ps(0, 2, 3);
    if constexpr (NT == 2) _tile_dpbf16ps(1, 2, 4);
    if (two) {
      _tile_loadd(2, kt[1] + d, k_stride[1]);
      _tile_dpbf16ps(5, 2, 3);
      if constexpr (NT == 2) _tile_dpbf16ps(6, 2, 4);
    }
  }
  _tile_stored(0, b.sc[0][0], 64);
  if constexpr (NT == 2) _tile_stored(1, b.sc[1][0], 64);
  if (two) {
    _tile_stored(5, b.sc[0][kAmxTokens], 64);
    if constexpr (NT == 2) _tile_stored(6, b.sc[1][kAmxTokens], 64);
  }
}

// V rows [0, nv) of the step in token pairs, zero rows after them (never read): for each 32 head
// dims, vpunpcklwd / vpunpckhwd of rows 2i and 2i + 1 as row i of two B tiles (b.vp[2c] and
// b.vp[2c + 1]), the token-pair order of values_tile_dp.
template <class Prefetch>
inline void amx_step_pack_v(const AmxStep& st, int nv, int D, AmxStepBuffers& b, Prefetch& pf) {
  const __m512i zero = _mm512_setzero_si512();
  for (int i = 0; i < kAmxStepTokens / 2; ++i) {
    if (i % 4 == 0) pf.piece();
    const int t = 2 * i;
    const bf16_t* r0 = t < nv ? st.v[t] : nullptr;
    const bf16_t* r1 = t + 1 < nv ? st.v[t + 1] : nullptr;
    for (int c = 0; c < D / kAmxDims; ++c) {
      const __m512i x0 = r0 != nullptr ? _mm512_loadu_si512(r0 + c * kAmxDims) : zero;
      const __m512i x1 = r1 != nullptr ? _mm512_loadu_si512(r1 + c * kAmxDims) : zero;
      _mm512_store_si512(b.vp[2 * c][i], _mm512_unpacklo_epi16(x0, x1));
      _mm512_store_si512(b.vp[2 * c + 1][i], _mm512_unpackhi_epi16(x0, x1));
    }
  }
}

// exp(x) for x <= 0 or -inf, the arguments of the softmax's weights and rescaling factors:
// x = k ln2 + r with k = round(x / ln2) and ln2 in two parts (Cody-Waite), e^r by the polynomial of
// Cephes' expf (relative error about 1e-7, as xsimd::exp), times 2^k by vscalefps. Below -88 (a
// weight under 1e-38) the argument is taken as -88, so -inf gives a denormal, not 0: the caller
// masks the -inf lanes. No overflow, NaN or infinity handling, which xsimd::exp spends most of its
// instructions on.
inline __m512 amx_exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, k);
}

// What the variants and the causal bounds do to a step's logits for one tile of 16 heads.
struct AmxStepLogits {
  float scale = 1.f;
  float cap = 0.f;                // soft-cap, 0: none
  const float* slopes = nullptr;  // the tile's 16 ALiBi slopes, or null
  int first_pos = 0;              // the step's first position minus (L - 1)
  const int* rows_n = nullptr;    // each head's tokens of the step (a prefix), or null: all n
};

// One step's logits (sc: token-major, t < n) folded into the states of 16 heads (m, l, acc rows
// of D), all heads as the lanes of one vector: per token, the logits scaled, soft-capped, ALiBi
// added and masked past each head's tokens (-inf), then one vector max; the states rescaled where
// the max grew (OnlineSoftmax::rescale_to); the weights exp(s - m) in token pairs, rounded to bf16
// and transposed into pw (16 heads x 32 tokens, 0 past each head's tokens). As in
// softmax_heads_512, a NaN or infinite logit among a head's tokens, or a NaN state, makes the
// head NaN (m = l = NaN, acc = NaN, weights 0), and a head with no finite logit yet keeps its
// empty state with weights 0.
template <class Prefetch>
inline void amx_step_softmax(float (*sc)[16], int n, const AmxStepLogits& v, float* m, float* l,
                             float* acc, int D, bf16_t (*pw)[kAmxStepTokens], Prefetch& pf) {
  using B = fbatch<xsimd::avx512bw>;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512 vscale = _mm512_set1_ps(v.scale);
  const __m512 cap = _mm512_set1_ps(v.cap),
               inv_cap = _mm512_set1_ps(v.cap > 0.f ? 1.f / v.cap : 0.f);
  const __m512 slopes = v.slopes != nullptr ? _mm512_loadu_ps(v.slopes) : _mm512_setzero_ps();
  const __m512i counts = v.rows_n != nullptr ? _mm512_loadu_si512(v.rows_n) : _mm512_set1_epi32(n);
  __m512 vmax = ninf;
  __mmask16 bad = 0;
  for (int t = 0; t < n; ++t) {
    if (t % 8 == 0) pf.piece();
    __m512 x = _mm512_mul_ps(_mm512_load_ps(sc[t]), vscale);
    if (v.cap > 0.f) {
      // A non-finite logit stays non-finite (tanh would make an infinite one finite).
      x = _mm512_add_ps(_mm512_mul_ps(cap, xsimd::tanh(B(_mm512_mul_ps(x, inv_cap)))),
                        _mm512_sub_ps(x, x));
    }
    if (v.slopes != nullptr) {
      x = _mm512_fmadd_ps(slopes, _mm512_set1_ps(static_cast<float>(v.first_pos + t)), x);
    }
    const __mmask16 valid = _mm512_cmpgt_epi32_mask(counts, _mm512_set1_epi32(t));
    x = _mm512_mask_mov_ps(ninf, valid, x);
    bad |= _mm512_mask_fpclass_ps_mask(valid, x, 0x99);  // NaN or +-Inf
    vmax = _mm512_max_ps(vmax, x);
    _mm512_store_ps(sc[t], x);
  }
  __m512 vm = _mm512_loadu_ps(m);
  __m512 vl = _mm512_loadu_ps(l);
  bad |= _mm512_cmp_ps_mask(vl, vl, _CMP_UNORD_Q);
  // OnlineSoftmax::rescale_to for every head: where the step raises the max, l *= alpha =
  // exp(m - max) (1 while the state is empty) and m = max.
  const __mmask16 grows = _mm512_cmp_ps_mask(vmax, vm, _CMP_GT_OQ);
  const __mmask16 rescale = grows & ~_mm512_cmp_ps_mask(vm, ninf, _CMP_EQ_OQ) & ~bad;
  alignas(64) float alphas[16];
  if (rescale != 0) {
    const __m512 alpha = amx_exp_nonpositive(_mm512_sub_ps(vm, vmax));
    vl = _mm512_mask_mul_ps(vl, rescale, vl, alpha);
    _mm512_store_ps(alphas, alpha);
  }
  vm = _mm512_mask_mov_ps(vm, grows, vmax);
  const __mmask16 empty = _mm512_cmp_ps_mask(vm, ninf, _CMP_EQ_OQ);
  // The shift of the logits: the running max, 0 while it is -inf (OnlineSoftmax::shift).
  const __m512 shift = _mm512_mask_mov_ps(vm, empty, _mm512_setzero_ps());
  const __mmask16 live = static_cast<__mmask16>(~(bad | empty));
  for (unsigned r = rescale; r != 0; r &= r - 1) {
    const int h = __builtin_ctz(r);
    const __m512 a = _mm512_set1_ps(alphas[h]);
    float* row = acc + static_cast<std::int64_t>(h) * D;
    for (int d = 0; d < D; d += 16)
      _mm512_storeu_ps(row + d, _mm512_mul_ps(_mm512_loadu_ps(row + d), a));
  }
  // Word 2 h of a pair is head h's weight of the even token, word 2 h + 1 the odd one's.
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  __m512 vsum = _mm512_setzero_ps();
  const auto weights = [&](int t) __attribute__((always_inline)) {
    if (t >= n) return _mm512_setzero_ps();
    const __m512 x = _mm512_load_ps(sc[t]);
    const __m512 e = amx_exp_nonpositive(_mm512_sub_ps(x, shift));  // x <= the max: <= 0
    return _mm512_maskz_mov_ps(live & _mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_UQ), e);
  };
  __m512 pairs[kAmxStepTokens / 2];
#pragma GCC unroll 2
  for (int i = 0; i < kAmxStepTokens / 2; ++i) {
    if (i % 4 == 0) pf.piece();
    const int t = 2 * i;
    if (t >= n) {
      pairs[i] = _mm512_setzero_ps();
      continue;
    }
    const __m512 p0 = weights(t), p1 = weights(t + 1);
    vsum = _mm512_add_ps(vsum, _mm512_add_ps(p0, p1));
    const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    pairs[i] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(interleave, w));
  }
  amx_transpose16(pairs);  // pairs[h]: head h's 16 token pairs, its 32 weights in token order
#pragma GCC unroll 16
  for (int h = 0; h < 16; ++h) _mm512_store_ps(reinterpret_cast<float*>(pw[h]), pairs[h]);
  vl = _mm512_mask_add_ps(vl, live, vl, vsum);
  const __m512 nan = _mm512_set1_ps(NAN);
  _mm512_storeu_ps(m, _mm512_mask_mov_ps(vm, bad, nan));
  _mm512_storeu_ps(l, _mm512_mask_mov_ps(vl, bad, nan));
  for (unsigned r = bad; r != 0; r &= r - 1) {
    float* row = acc + static_cast<std::int64_t>(__builtin_ctz(r)) * D;
    std::fill(row, row + D, NAN);
  }
}

// acc += P V for NT (1 or 2) tiles of 16 heads (pw: their P tiles; acc: the first tile's rows, the
// second's 16 D floats on) over the step's packed V (b.vp): per 32 head dims, the accumulators of
// both 16-dim halves of each tile of heads loaded, one full-depth _tile_dpbf16ps each, stored
// back. The P tiles stay in tmm0-1 across the head dims; V takes tmm2-3, the accumulators tmm4-7.
template <int NT, class Prefetch>
inline void amx_step_values(const bf16_t (*pw)[16][kAmxStepTokens], float* acc, int D,
                            const AmxStepBuffers& b, Prefetch& pf) {
  constexpr std::int64_t kPRow = kAmxStepTokens * sizeof(bf16_t);
  const std::int64_t acc_stride = D * static_cast<std::int64_t>(sizeof(float));
  _tile_loadd(0, pw[0], kPRow);
  if constexpr (NT == 2) _tile_loadd(1, pw[1], kPRow);
  float* acc1 = acc + static_cast<std::int64_t>(kAmxWideHeads) * D;
  for (int d = 0; d < D; d += kAmxDims) {
    pf.piece();
    const int c = d / kAmxDims;
    _tile_loadd(2, b.vp[2 * c], 64);
    _tile_loadd(3, b.vp[2 * c + 1], 64);
    _tile_loadd(4, acc + d, acc_stride);
    _tile_loadd(5, acc + d + kAmxTokens, acc_stride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if constexpr (NT == 2) {
      _tile_loadd(6, acc1 + d, acc_stride);
      _tile_loadd(7, acc1 + d + kAmxTokens, acc_stride);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    _tile_stored(4, acc + d, acc_stride);
    _tile_stored(5, acc + d + kAmxTokens, acc_stride);
    if constexpr (NT == 2) {
      _tile_stored(6, acc1 + d, acc_stride);
      _tile_stored(7, acc1 + d + kAmxTokens, acc_stride);
    }
  }
}

// The tokens [nv, rows_n[h]) of the heads whose causal bound lies past nv (the step's V tiles
// hold rows [0, nv) only: a row past a head's bound may be NaN, and 0 times NaN is NaN), head by
// head on vdpbf16ps with the P tile's weights, piece by piece of the step.
inline void amx_step_values_rest(const bf16_t (*pw)[kAmxStepTokens], const int* rows_n, int nv,
                                 const AmxStep& st, float* acc, int D) {
  for (int h = 0; h < kAmxWideHeads; ++h) {
    float* row = acc + static_cast<std::int64_t>(h) * D;
    for (int t = nv; t < rows_n[h];) {
      int e = t + 1;  // the end of t's piece within the head's tokens
      while (e < rows_n[h] && st.seg[e] == st.seg[t]) ++e;
      const bf16_t* p = pw[h] + t;
      for (int d = 0; d < D; d += kAmxDims)
        values_tile_dp<1, 2>(p, 0, st.v[t], st.ts, e - t, row, D, d);
      t = e;
    }
  }
}

// One task on the steps (amx_steps_take; q packed in tiles of 16 heads, the tiles configured by
// amx_configure_step_tiles): the states m, l, acc of kv_count * G heads from fresh, the
// accumulators in token-pair order. Steps are SB = 32 / block_size blocks of the item, and each
// step runs every kv head of the range in turn (the blocks' stretches of K and V for all of them,
// as run_item walks them).
inline void run_item_amx_steps(const ItemContext& c, const WorkItem& it, int kv_count,
                               const AmxQWord* q_heads, float* m, float* l, float* acc) {
  const int D = c.layout.head_dim, BS = c.layout.block_size, G = c.group_size;
  const std::int64_t ts = c.layout.token_stride;
  const int L = c.context_lens[it.seq];
  const bf16_t* k_cache = static_cast<const bf16_t*>(c.k_cache);
  const bf16_t* v_cache = static_cast<const bf16_t*>(c.v_cache);
  const int kv_first = it.kv_head;
  const int heads = kv_count * G;
  for (int g = 0; g < heads; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + static_cast<std::int64_t>(heads) * D, 0.f);

  const int SB = kAmxStepTokens / BS;
  const int blocks = it.block_end - it.block_begin;
  const int steps = (blocks + SB - 1) / SB;
  // Units (block, kv head) in compute order: step s, kv head i, block j of the step is unit
  // (s kv_count + i) SB + j; a step short of SB blocks (the last) leaves units empty.
  const int units = steps * kv_count * SB;
  const auto start_unit = [&](PacedPrefetch& p, int u, int pieces) {
    const int s = u / (kv_count * SB), i = u / SB % kv_count;
    const int blk = it.block_begin + s * SB + u % SB;
    if (u >= units || blk >= it.block_end) {
      p.start(nullptr, nullptr, 0, 0, 0, 1);
      return;
    }
    const std::int64_t base = c.layout.offset(c.table.block(it.seq, blk), kv_first + i, 0);
    p.start(k_cache + base, v_cache + base, valid_in_block(L, BS, blk), D * sizeof(bf16_t),
            ts * static_cast<std::int64_t>(sizeof(bf16_t)), pieces);
  };
  AmxStepPrefetch<decltype(start_unit)> pf{{}, start_unit};
  const int ahead = prefetch_units(2 * static_cast<std::int64_t>(BS) * D * sizeof(bf16_t));
  pf.due(0, std::min(units, ahead), 1);
  pf.finish();
  // The prefetch's pieces per unit: the calls of a full (step, kv head), SB units, are 4 in
  // amx_step_pack_v, 3 per 32 dims and pair of tiles of heads (scores and values) and 8 per tile
  // in amx_step_softmax. Spread so, a unit's lines leave a few at a time.
  const int pairs_of_tiles = (G / kAmxWideHeads + 1) / 2;
  const int pieces = std::max(1, (4 + (3 * (D / kAmxDims) + 2 * 8) * pairs_of_tiles) / SB);

  const int first_tok = first_computed_token(c, it.seq, L);
  const QueryBounds qb = query_bounds(c, it.seq, L);  // query tokens together

  AmxStepBuffers b;
  std::memset(b.pw, 0, sizeof(b.pw) + sizeof(b.pw_end));
  AmxStep st;
  st.ts = ts;
  int ids[kAmxStepTokens], skips[kAmxStepTokens], ns[kAmxStepTokens];
  int rows_n[2][kAmxWideHeads];
  for (int s = 0; s < steps; ++s) {
    const int blk0 = it.block_begin + s * SB;
    const int nblk = std::min(SB, it.block_end - blk0);
    for (int j = 0; j < nblk; ++j) {
      const int blk = blk0 + j;
      ids[j] = c.table.block(it.seq, blk);
      skips[j] = std::max(0, first_tok - blk * BS);
      ns[j] = std::max(0, valid_in_block(L, BS, blk) - skips[j]);
    }
    st.p0 = blk0 * BS + skips[0];
    for (int i = 0; i < kv_count; ++i) {
      pf.due(((s * kv_count + i) * SB) + ahead, SB, pieces);
      const int kv = kv_first + i;
      st.n = 0;
      for (int j = 0; j < nblk; ++j) {
        const std::int64_t base = c.layout.offset(ids[j], kv, skips[j]);
        for (int t = 0; t < ns[j]; ++t, ++st.n) {
          st.k[st.n] = k_cache + base + t * ts;
          st.v[st.n] = v_cache + base + t * ts;
          st.seg[st.n] = static_cast<std::uint8_t>(j);
        }
      }
      if (st.n == 0) continue;
      // The step's tokens every row attends (the first query token's bound), whose V rows enter
      // the tiles; the rest is per head (amx_step_values_rest).
      const bool causal = c.token_group > 0 && st.p0 + st.n - 1 > qb.first_query_pos;
      const int nv = causal ? std::clamp(qb.last_pos(0) - st.p0 + 1, 0, st.n) : st.n;
      amx_step_pack_v(st, nv, D, b, pf);
      const AmxQWord* q = q_heads + static_cast<std::int64_t>(i) * G * D;
      float* mi = m + i * G;
      float* li = l + i * G;
      float* ai = acc + static_cast<std::int64_t>(i) * G * D;
      for (int g = 0; g < G;) {
        const int nt = G - g >= 2 * kAmxWideHeads ? 2 : 1;
        AmxStepLogits v[2];
        for (int j = 0; j < nt; ++j) {
          const int g0 = g + j * kAmxWideHeads;
          v[j].scale = c.scale;
          v[j].cap = c.soft_cap;
          v[j].first_pos = st.p0 - (L - 1);
          if (c.alibi_slopes != nullptr) v[j].slopes = c.alibi_slopes + kv * G + g0;
          if (causal) {
            for (int r = 0; r < kAmxWideHeads; ++r) {
              rows_n[j][r] = std::clamp(qb.last_pos(g0 + r) - st.p0 + 1, 0, st.n);
            }
            v[j].rows_n = rows_n[j];
          }
        }
        const AmxQWord* qg = q + static_cast<std::int64_t>(g) * D;
        float* ag = ai + static_cast<std::int64_t>(g) * D;
        if (nt == 2) {
          amx_step_scores<2>(qg, D, st, b, pf);
        } else {
          amx_step_scores<1>(qg, D, st, b, pf);
        }
        for (int j = 0; j < nt; ++j) {
          const int g0 = g + j * kAmxWideHeads;
          amx_step_softmax(b.sc[j], st.n, v[j], mi + g0, li + g0,
                           ag + static_cast<std::int64_t>(j) * kAmxWideHeads * D, D, b.pw[j], pf);
        }
        if (nt == 2) {
          amx_step_values<2>(b.pw, ag, D, b, pf);
        } else {
          amx_step_values<1>(b.pw, ag, D, b, pf);
        }
        if (causal) {
          for (int j = 0; j < nt; ++j) {
            amx_step_values_rest(b.pw[j], rows_n[j], nv, st,
                                 ag + static_cast<std::int64_t>(j) * kAmxWideHeads * D, D);
          }
        }
        g += nt * kAmxWideHeads;
      }
    }
  }
  pf.finish();
}

}  // namespace
}  // namespace pagedattn::detail::cpu

#endif
