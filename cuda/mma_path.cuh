// The tensor-core path (f16/bf16 caches with q in the same dtype, fp8 caches, f32 caches in 3xTF32;
// kernel_choice.hpp says which calls): S = Q K^T and O += P V with mma.sync (m16n8k16; m16n8k8
// for f32, tf32_frags.cuh), the CTA's rows (query token x query head of the group; see
// query_rows.cuh) as M (padded to 16; up to 4 row tiles, 64 rows), 16-token slices as N (scores)
// and K (P V). The keys and values are read once for all of a sequence's query tokens. The 4
// warps take different token slices (or row tiles for more than 16 rows), each with its own
// online-softmax state per row, and merge in a fixed order at the end. For an f32 out (or an f16
// out from a bf16 cache) P is split into hi + lo parts of the storage type, so the P V product
// keeps f32-level accuracy; when out is bf16, or f16 from an f16 cache, P's rounding to the
// storage type is below out's own rounding and P goes in as one part (half the P V products).
//
// The steps, one file each: the shapes and shared state (mma_layout.cuh), Q's fragments and the
// scores (mma_scores.cuh), the logits (mma_logits.cuh), the online softmax (mma_softmax.cuh),
// P V (mma_pv.cuh) and the merge of the warps with the stores (mma_epilogue.cuh). mma_fold runs
// the steps on a slice or a fold of slices; mma_item runs an item's tiles.
#pragma once

#include <cstdint>

#include "kv_pipeline.cuh"
#include "mma_epilogue.cuh"
#include "mma_layout.cuh"
#include "mma_logits.cuh"
#include "mma_pv.cuh"
#include "mma_scores.cuh"
#include "mma_softmax.cuh"
#include "mma_token_scales.cuh"
#include "pagedattn/online_softmax.hpp"
#include "query_rows.cuh"
#include "split_params.cuh"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

// Folds NS slices of the tile, sl0, sl0 + WT, ..., into the warp's states with one row max,
// one rescale of the accumulator and one pass of exponentials for all of them: with more
// than 16 rows a warp takes 2 or 4 slices of each tile, and folding them one by one made
// each wait on the previous one's softmax (a chain the few warps per SM could not hide).
// NS = 1 is the slice-by-slice fold: there, with several query tokens, the rows may disagree
// on the slice's last tokens (causal) and, with a window, on its first ones (uniform); then
// each element gets its row's verdict, bit n * 4 + e of `keep`. The wide fold (NS > 1) is
// taken only on tiles where the rows agree.
// kTs: the tile's per-token scales (tile.scales) join the fold (mma_token_scales.cuh), vmax
// being the warp's running largest V scale.
template <typename T, int D, bool kMulti, int NS, bool kTs, typename V>
__device__ __forceinline__ void mma_fold(const SplitParams& p, const V& var, MmaWarp w, MmaQSmem qs,
                                         const std::uint32_t (&qf)[MmaCfg<T, D>::kQK][4],
                                         const int (&k_at)[4], const int (&v_at)[4],
                                         const MmaRows<V>& rows, MmaTile tile, int last_pos,
                                         const CtaItem& item, int n_dis, int sl0,
                                         SoftmaxState2 (&st)[2], float (&bad)[2][2],
                                         float (&o)[D / 8][4], float& vmax) {
  float s[NS][2][4];
  mma_scores<T, D, NS>(w, qs, qf, k_at, tile.k, sl0, s);
  if constexpr (kTs) scale_scores_by_token<NS>(tile.scales, w, sl0, s);
  const int t0 = tile.t0 + sl0 * 16;  // the (first) slice's first token
  unsigned keep = 0xffu;
  const bool disagree =
      NS == 1 && kMulti && rows_disagree(t0, t0 + 15, last_pos, n_dis, p.plan.window_left);
  if (disagree) keep = mma_keep_bits(p, rows, w, t0, last_pos, item);
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    mma_logits<kMulti>(var, w, rows, tile, last_pos, sl0 + j * w.WT, s[j], keep, bad);
  }
  float alpha[2];
  mma_softmax<NS>(s, rows.efac, st, alpha);
  if constexpr (kTs) {
    scale_weights_by_token<NS>(tile.scales + MmaCfg<T, D>::TT, w, sl0, s, vmax, alpha);
  }
  mma_rescale<D>(o, alpha);
  if (MmaCfg<T, D>::kTf32 || p.p_lo) {  // tf32 splits P whatever p_lo says
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      mma_values<T, D, true>(v_at, tile.v, sl0 + j * w.WT, s[j], disagree, keep, o);
    }
  } else {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      mma_values<T, D, false>(v_at, tile.v, sl0 + j * w.WT, s[j], disagree, keep, o);
    }
  }
}

// kMulti: the item's sequence has several query tokens (item.n_q > 1) or a tree mask, whose
// single query token may drop its own position. One-token decode runs the
// kMulti = false instance, where the per-row masks and the row arithmetic fold away: one-token
// decode, the common case, pays nothing for multi-token queries (docs/cuda.md). kFold (with
// kMulti, in the wide build): a warp that takes 2 or 4 slices of a full tile folds them with one
// softmax step (mma_fold). V: the variant policy (variant_policy.cuh).
// Pipe: MmaCfg's pipeline, with the token scales' ring (KvPipeline::kScaleFloats > 0) in the
// token-scale build (SplitBuild::token_scales).
template <typename T, int D, bool kMulti, bool kFold, typename V, typename Pipe>
__device__ __forceinline__ void mma_item(const SplitParams& p, const V& var, const CtaItem& item,
                                         Pipe& pipe, char* smem) {
  using Cfg = MmaCfg<T, D>;
  constexpr bool kTs = Pipe::kScaleFloats > 0;
  static_assert(!kTs || !kFold, "token scales: the plain build only");
  using Geo = RowGeom<T, D>;
  constexpr int STAGES = Cfg::STAGES;
  const MmaWarp w(item.rows);
  const int R = item.rows;
  const std::int64_t part_base = item.part_base;
  char* sQ = smem + Cfg::STAGE_AREA;
  const T* q = static_cast<const T*>(p.q);
  MmaRows<V> rows;
#pragma unroll
  for (int r = 0; r < 2; ++r) rows.qr[r] = query_row<kMulti>(p, item, w.wh * 16 + w.g + 8 * r);
  const int n_dis = disagree_tokens(p, item.n_q);  // rows_disagree's query tokens
  // Q of the rows (same dtype as the cache, so exact), rows past the CTA's zero.
  std::uint32_t qf[Cfg::kQK][4];
  rows.logit_fac[0] = rows.logit_fac[1] = p.scale_log2;
  mma_load_q<T, D, kMulti>(p, item, q, w, rows.qr, sQ, qf, rows.logit_fac);
  pipe.prologue();
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Rows g and g + 8 of the warp's row tile; the lanes of a quad hold the same max and partial
  // sums of their own columns (summed over the quad at the end).
  SoftmaxState2 st[2] = {SoftmaxState2::empty(), SoftmaxState2::empty()};
  // NaN once a row met a non-finite logit: per row, two chains (n-tiles 0 and 1) so the
  // checks of a fold are not one dependent sequence.
  float bad[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  // kTs: o is in units of the largest V token scale met so far (0 before the first).
  float vmax = 0.f;
  rows.late = !var.transforms_logits() &&
              __all_sync(0xffffffffu, rows.logit_fac[0] > 0.f && rows.logit_fac[1] > 0.f);
  rows.efac[0] = rows.late ? rows.logit_fac[0] : 1.f;
  rows.efac[1] = rows.late ? rows.logit_fac[1] : 1.f;
  // ldmatrix lane addressing: (row, chunk pair) of each lane's 8x8 matrix row of Q, K and V;
  // chunk 2 * step + half for k-step `step`.
  const MmaQSmem qs{sQ, (w.lane & 7) + ((w.lane >> 3) & 1) * 8, w.lane >> 4};
  const int k_tok = (w.lane & 7) + (w.lane >> 4) * 8, k_half = (w.lane >> 3) & 1;
  const int v_tok = (w.lane & 7) + ((w.lane >> 3) & 1) * 8, v_half = w.lane >> 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) rows.vrow[r] = var.row(rows.qr[r].head, rows.qr[r].valid);
  // Each lane's ldmatrix offsets of K and V within a 16-row slice, hoisted out of the tile loop:
  // slice sl adds sl * 16 rows (a multiple of 8, so the swizzle is unchanged), and k-step kk
  // reads chunk 2 kk + half, at the offset of step kk % 4 plus 128 bytes per 4 steps (the
  // swizzle permutes chunks only within a 128-byte segment).
  int k_at[4], v_at[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) k_at[j] = Geo::offset(k_tok, 2 * j + k_half);
  if constexpr (Cfg::kTf32) {
    tf32_v_offsets<D>(w.g, w.q4, v_at);  // 8-byte loads, not ldmatrix
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v_at[j] = Geo::offset(v_tok, 2 * j + v_half);
  }

  for (int it = 0; it < pipe.ntiles; ++it) {
    const int next_id = pipe.begin(it);
    const int stage = it % STAGES;
    const int nrows = pipe.rows(it);
    MmaTile tile{pipe.k(stage), pipe.v(stage), pipe.mask(it), pipe.tok_begin + it * Cfg::TT,
                 nullptr};
    if constexpr (kTs) tile.scales = pipe.token_scales(it);
    // A full tile on which the rows agree, with 2 or 4 slices per warp: one fold of them all.
    // (The wide build only: see split_kernel in split_kernel.cuh.)
    if constexpr (kMulti && kFold) {
      if (w.WT < kWarps && nrows == Cfg::TT &&
          !rows_disagree(tile.t0, tile.t0 + Cfg::TT - 1, pipe.last_pos, n_dis,
                         p.plan.window_left)) {
        if (w.WT == 1) {
          mma_fold<T, D, kMulti, 4, false>(p, var, w, qs, qf, k_at, v_at, rows, tile, pipe.last_pos,
                                           item, n_dis, 0, st, bad, o, vmax);
        } else {
          mma_fold<T, D, kMulti, 2, false>(p, var, w, qs, qf, k_at, v_at, rows, tile, pipe.last_pos,
                                           item, n_dis, w.wt, st, bad, o, vmax);
        }
        pipe.end(it, next_id);
        continue;
      }
    }
    for (int sl = w.wt; sl * 16 < nrows; sl += w.WT) {
      mma_fold<T, D, kMulti, 1, kTs>(p, var, w, qs, qf, k_at, v_at, rows, tile, pipe.last_pos, item,
                                     n_dis, sl, st, bad, o, vmax);
    }
    pipe.end(it, next_id);
  }
  pipe.drain();  // the stage area becomes the merge scratch
  mma_finish_rows(st, bad);
  mma_stash<T, D>(p, item, smem, w, st, o, kTs ? vmax : 1.f);
  __syncthreads();
  mma_merge_store<T, D, kMulti>(p, var, item, smem, w, R, part_base);
}

}  // namespace pagedattn::detail::cuda
