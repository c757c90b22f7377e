// The epilogue of the tensor-core path (mma_path.cuh): the warps' states and accumulators merged
// in a fixed order, then each row written finished (out and lse) or as a partial state for the
// combine.
//
// Every warp puts its rows' states and accumulators in the scratch (slot wh * WT + wt); then
// all 128 threads merge them, TPR threads per row of the head tiles, each over D / TPR
// columns, the WT warps of a head tile folded in order wt = 0, 1, ... Spread over all threads,
// the merge stays a small share of a short item, where one warp doing it for the CTA would not.
#pragma once

#include <cstdint>

#include "fp8_frags.cuh"
#include "mma_layout.cuh"
#include "pagedattn/online_softmax.hpp"
#include "query_rows.cuh"
#include "split_params.cuh"
#include "store_out.cuh"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

// The warp's rows g and g + 8 into its slot of the scratch (smem, the drained stage area): the
// D columns of each row, then its (m, l). o_unit: the unit of o (the largest V token scale of the
// token-scale build, mma_token_scales.cuh; else 1).
template <typename T, int D>
__device__ __forceinline__ void mma_stash(const SplitParams& p, const CtaItem& item, char* smem,
                                          MmaWarp w, const SoftmaxState2 (&st)[2],
                                          const float (&o)[D / 8][4], float o_unit) {
  using Cfg = MmaCfg<T, D>;
  float* scratch = reinterpret_cast<float*>(smem);
  constexpr int SROW = D + 2;
  const float vs = Cfg::kCodes ? head_scale(p.v_scale, p.v_scales, item.kv) * o_unit : 1.f;
  float* base = scratch + ((w.wh * w.WT + w.wt) * 16) * SROW;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* row = base + (w.g + 8 * r) * SROW;
    if (w.q4 == 0) *reinterpret_cast<float2*>(row + D) = make_float2(st[r].m, st[r].l);
    if constexpr (Cfg::kCodes || Cfg::kTf32) {
      // n-tiles 2 c and 2 c + 1 hold dims 16 c + 4 q4 .. + 3 (fp8_chunk_dim; the tf32 path's
      // columns are in the same order); V's scale joins the sum here:
      // sum p (code x v_scale) = v_scale x sum p code.
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        const int d = fp8_chunk_dim(c, w.q4);
        *reinterpret_cast<float2*>(row + d) =
            make_float2(o[2 * c][2 * r] * vs, o[2 * c + 1][2 * r] * vs);
        *reinterpret_cast<float2*>(row + d + 2) =
            make_float2(o[2 * c][2 * r + 1] * vs, o[2 * c + 1][2 * r + 1] * vs);
      }
    } else {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<float2*>(row + n * 8 + 2 * w.q4) =
            make_float2(o[n][2 * r], o[n][2 * r + 1]);
      }
    }
  }
}

// Columns c and c + 1 of a row, merged over the WT warps of its row tile (first: the row in the
// first warp's slot; unrolled: fac stays in registers). WT by reference: taken by value, the
// item compiles to different code (mma_layout.cuh).
template <int D>
__device__ __forceinline__ float2 mma_merged(const float* first, const float (&fac)[kWarps],
                                             const int& WT, int c) {
  constexpr int SROW = D + 2;
  float2 a = make_float2(0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w >= WT) break;
    const float2 v = *reinterpret_cast<const float2*>(first + w * 16 * SROW + c);
    a.x = fmaf(v.x, fac[w], a.x);
    a.y = fmaf(v.y, fac[w], a.y);
  }
  return a;
}

// After the stash and a barrier: each of the CTA's R rows merged over its warps' slots by tpr
// threads, then written (part_base: the item's first partial state).
template <typename T, int D, bool kMulti, typename V>
__device__ __forceinline__ void mma_merge_store(const SplitParams& p, const V& var,
                                                const CtaItem& item, char* smem, MmaWarp w, int R,
                                                std::int64_t part_base) {
  const float* scratch = reinterpret_cast<const float*>(smem);
  constexpr int SROW = D + 2;
  const int tile_rows = w.WH * 16;       // 16, 32 or 64
  const int tpr = kThreads / tile_rows;  // threads per row: 8, 4 or 2
  const int hl = w.tid / tpr;            // the row
  if (hl >= R) return;
  const QueryRow row = query_row<kMulti>(p, item, hl);
  const int mw = hl / 16, mr = hl % 16;  // its row tile and row in it
  const float* first = scratch + ((mw * w.WT) * 16 + mr) * SROW;
  // The row's merged state and each warp's factor (fold order wt = 0, 1, ...).
  SoftmaxState2 total{first[D], first[D + 1]};
  float fac[kWarps];
  fac[0] = 1.f;
#pragma unroll
  for (int v = 1; v < kWarps; ++v) fac[v] = 0.f;
#pragma unroll
  for (int v = 1; v < kWarps; ++v) {  // unrolled, so fac stays in registers
    if (v >= w.WT) break;
    const float* other = first + v * 16 * SROW;
    float fa = 0.f, fb = 0.f;
    if (!total.merge(SoftmaxState2{other[D], other[D + 1]}, fa, fb)) continue;
#pragma unroll
    for (int u = 0; u < v; ++u) fac[u] *= fa;
    fac[v] = fb;
  }
  const int c0 = (w.tid % tpr) * 2;  // pairs of columns, tpr threads side by side
  if (item.finish) {                 // the sequence's only split: out and lse directly
    const std::int64_t out_row = static_cast<std::int64_t>(row.qrow) * p.num_heads + row.head;
    const std::int64_t out_at = row.qrow * p.out_stride + static_cast<std::int64_t>(row.head) * D;
    const float fa = var.finish(total, row.head);  // the variant's finish (a sink)
    const float inv = total.inv_sum() * fa;
    for (int c = c0; c < D; c += 2 * tpr) {
      const float2 a = mma_merged<D>(first, fac, w.WT, c);
      store_out_pair(p.out, p.out_dtype, out_at + c, a.x * inv, a.y * inv);
    }
    if (p.lse != nullptr && c0 == 0) p.lse[out_row] = total.lse();
    return;
  }
  const std::int64_t pidx =
      part_base + static_cast<std::int64_t>(item.n_q - 1 - row.back) * p.num_heads + row.head;
  if (c0 == 0) {
    p.part_ml[2 * pidx] = total.m;
    p.part_ml[2 * pidx + 1] = total.l;
  }
  float* dst = p.part_acc + pidx * D;
  for (int c = c0; c < D; c += 2 * tpr) {
    *reinterpret_cast<float2*>(dst + c) = mma_merged<D>(first, fac, w.WT, c);
  }
}

}  // namespace pagedattn::detail::cuda
