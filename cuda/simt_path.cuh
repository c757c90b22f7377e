// The CUDA-core path (f32 caches, or q in another dtype than the cache): a half-warp
// per token, each lane 1/16 of the head dim, up to 4 rows (query token x query head; see
// query_rows.cuh) per warp (scores only for the rows a warp holds), per-token online softmax in
// f32. More than 16 rows run in row chunks of 16, one CTA each (K/V read once per chunk, from L2
// for all but the first).
//
// The steps: the shapes and shared state (simt_layout.cuh), reading q and the tiles' rows as f32
// (simt_loads.cuh), a token's scores and its online-softmax update (here), the merge of the
// half-warps and warps with the stores (simt_epilogue.cuh).
#pragma once

#include <cstdint>

#include "kv_pipeline.cuh"
#include "pagedattn/online_softmax.hpp"
#include "query_rows.cuh"
#include "simt_epilogue.cuh"
#include "simt_layout.cuh"
#include "simt_loads.cuh"
#include "split_params.cuh"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

// The warp's query rows: each lane's E elements of q, scaled into log2 units, and the variant
// policy's constants of each row.
template <int D, bool kMulti, typename V>
__device__ __forceinline__ void simt_rows(const SplitParams& p, const V& var, const CtaItem& item,
                                          SimtWarp w, SimtRows<D, V>& rows) {
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
#pragma unroll
  for (int h = 0; h < HW; ++h) rows.qr[h] = query_row<kMulti>(p, item, w.h_first + h);
  rows.tree_at = kMulti ? tree_mask_at(p, item) : -1;
  // q . (code x k_scale) = (q x k_scale) . code: a quantized cache's K scale joins the logit scale.
  const float q_scale = p.scale_log2 * head_scale(p.k_scale, p.k_scales, item.kv);
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    const std::int64_t at =
        rows.qr[h].qrow * p.q_stride + static_cast<std::int64_t>(rows.qr[h].head) * D;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      rows.q[h][e] = h < w.nh ? load_q(p.q, p.q_dtype, at + w.l16 * E + e) * q_scale : 0.f;
    }
  }
#pragma unroll
  for (int h = 0; h < HW; ++h) rows.vrow[h] = var.row(rows.qr[h].head, h < w.nh);
}

// The logits sc of token t (row r of tile kS; ok: its row-mask bit; k_token: its K token scale,
// 1 without) for the warp's rows, each half-warp's dot products summed over its 16 lanes
// (shuffles over all 32), and whether each row attends to it (att). bad: NaN once a row met a
// non-finite logit.
template <typename T, int D, bool kMulti, typename V>
__device__ __forceinline__ void simt_scores(const SplitParams& p, const V& var, const CtaItem& item,
                                            int last_pos, SimtWarp w, const SimtRows<D, V>& rows,
                                            const char* kS, int r, bool ok, int t, float k_token,
                                            float (&sc)[kSimtRowsPerWarp],
                                            bool (&att)[kSimtRowsPerWarp],
                                            float (&bad)[kSimtRowsPerWarp]) {
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
  float kr[E];
  load_slice<T, D, E>(kS, r, w.l16, kr);
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    if (h >= w.nh) break;  // warp-uniform: a small group leaves a warp's last slots empty
    float d = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) d = fmaf(rows.q[h][e], kr[e], d);
#pragma unroll
    for (int o2 = 8; o2 > 0; o2 >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o2);
    d *= k_token;  // q . (code x scale) = (q . code) x scale
    // Whether the row attends to the token: with several query tokens (or a tree mask), each
    // row's own causal bound, window and tree-mask row (the tile mask covers the earliest
    // query's window).
    att[h] =
        ok &&
        (!kMulti || (item.n_q == 1 && p.tree_mask == nullptr) ||
         (row_attends(t, last_pos, rows.qr[h].back, p.plan.window_left) &&
          tree_keeps(p, rows.tree_at, item.n_q, rows.qr[h].back, t - (last_pos - (item.n_q - 1)))));
    // x * 0 is 0 for a finite logit, NaN otherwise.
    bad[h] = fmaf(att[h] ? d : 0.f, 0.f, bad[h]);
    if (var.transforms_logits()) d = var.logit(rows.vrow[h], d, t - last_pos + rows.qr[h].back);
    sc[h] = d;
  }
}

// Token r of tile vS (read, so per half-warp; no shuffles inside; v_token: its V token scale, 1
// without) into the online-softmax state and accumulator of each row that attends to it.
template <typename T, int D>
__device__ __forceinline__ void simt_update(SimtWarp w, const char* vS, int r, float v_token,
                                            const float (&sc)[kSimtRowsPerWarp],
                                            const bool (&att)[kSimtRowsPerWarp],
                                            float (&acc)[kSimtRowsPerWarp][D / 16],
                                            SoftmaxState2 (&st)[kSimtRowsPerWarp]) {
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
  float vr[E];
  load_slice<T, D, E>(vS, r, w.l16, vr);
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    if (h >= w.nh) break;
    // A token the row does not attend to is skipped, not weighted 0: 0 x a non-finite V
    // would be NaN.
    if (!att[h]) continue;
    const float alpha = st[h].rescale_to(sc[h]);
    const float pr = st[h].weight(sc[h]);
    st[h].add(pr);
    const float pv = pr * v_token;  // the weight of the code: p x the row's V scale
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] = fmaf(pv, vr[e], acc[h][e] * alpha);
  }
}

// kMulti: the item's sequence has several query tokens (item.n_q > 1) or a tree mask, whose
// single query token may drop its own position. One-token decode runs the kMulti = false instance,
// where the per-row causal tests and the row arithmetic fold away. V: the variant policy
// (variant_policy.cuh).
template <typename T, int D, bool kMulti, typename V>
__device__ __forceinline__ void simt_item(const SplitParams& p, const V& var, const CtaItem& item,
                                          typename SimtCfg<T, D>::Pipe& pipe, char* smem) {
  using Cfg = SimtCfg<T, D>;
  constexpr int STAGES = Cfg::STAGES;
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
  const SimtWarp w(item.rows);
  const std::int64_t part_base = item.part_base;
  SimtRows<D, V> rows;
  simt_rows<D, kMulti>(p, var, item, w, rows);
  pipe.prologue();
  float acc[HW][E];
  SoftmaxState2 st[HW];
  float bad[HW];  // NaN once a head met a non-finite logit
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    st[h] = SoftmaxState2::empty();
    bad[h] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
  }
  for (int it = 0; it < pipe.ntiles; ++it) {
    const int next_id = pipe.begin(it);
    const int stage = it % STAGES;
    const int nrows = w.nh > 0 ? pipe.rows(it) : 0;
    const char* kS = pipe.k(stage);
    const char* vS = pipe.v(stage);
    const unsigned* tile_mask = pipe.mask(it);
    // The tile's token scales (kv_pipeline.cuh), where the cache has them.
    const float* token_scales = nullptr;
    if constexpr (Cfg::Pipe::kScaleFloats > 0) {
      if (p.k_token_scales != nullptr) token_scales = pipe.token_scales(it);
    }
    for (int r0 = w.wt * 2; r0 < nrows; r0 += 2 * w.WT) {
      const int r = r0 + w.half;  // r < TT always; rows past `nrows` are masked
      const bool ok = (tile_mask[r >> 5] >> (r & 31)) & 1u;
      const int t = pipe.tok_begin + it * Cfg::TT + r;
      float sc[HW];
      bool att[HW];
      const float k_token = token_scales != nullptr ? token_scales[r] : 1.f;
      const float v_token = token_scales != nullptr ? token_scales[Cfg::TT + r] : 1.f;
      simt_scores<T, D, kMulti>(p, var, item, pipe.last_pos, w, rows, kS, r, ok, t, k_token, sc,
                                att, bad);
      if (ok) simt_update<T, D>(w, vS, r, v_token, sc, att, acc, st);
    }
    pipe.end(it, next_id);
  }
  pipe.drain();  // the stage area becomes the merge scratch
  simt_epilogue<D>(p, var, item, part_base, w, rows.qr, acc, st, bad, smem);
}

}  // namespace pagedattn::detail::cuda
