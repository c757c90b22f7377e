// The epilogue of the CUDA-core path (simt_path.cuh): the half-warps' and then the warps' states
// and accumulators merged in a fixed order, and each row written finished (out and lse) or as a
// partial state for the combine.
#pragma once

#include <cstdint>

#include "pagedattn/online_softmax.hpp"
#include "query_rows.cuh"
#include "simt_layout.cuh"
#include "split_params.cuh"
#include "store_out.cuh"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

// Merge the two half-warps (lanes l and l ^ 16 hold the same elements). A non-finite logit
// first makes the head's state NaN (m = l = NaN), which every merge after this one, and the
// combine, carry through to out and lse (as the CPU backend does).
template <int D>
__device__ __forceinline__ void simt_merge_halves(float (&acc)[kSimtRowsPerWarp][D / 16],
                                                  SoftmaxState2 (&st)[kSimtRowsPerWarp],
                                                  const float (&bad)[kSimtRowsPerWarp]) {
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    if (bad[h] != 0.f) st[h].m = st[h].l = NAN;
    const SoftmaxState2 other{__shfl_xor_sync(0xffffffffu, st[h].m, 16),
                              __shfl_xor_sync(0xffffffffu, st[h].l, 16)};
    float fa = 0.f, fb = 0.f;
    st[h].merge(other, fa, fb);  // both empty: fa = fb = 0, the accumulators are 0 anyway
                                 // Only the lower half's result is used below.
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float ao = __shfl_xor_sync(0xffffffffu, acc[h][e], 16);
      acc[h][e] = acc[h][e] * fa + ao * fb;
    }
  }
}

// The warp's rows (V's scale applied) written by the lower half of warp wt = 0: out and lse
// directly for the sequence's only split, else the partial state (part_base: the item's first).
template <int D, typename V>
__device__ __forceinline__ void simt_store(const SplitParams& p, const V& var, const CtaItem& item,
                                           std::int64_t part_base, SimtWarp w,
                                           const QueryRow (&qr)[kSimtRowsPerWarp],
                                           float (&acc)[kSimtRowsPerWarp][D / 16],
                                           SoftmaxState2 (&st)[kSimtRowsPerWarp]) {
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
  // sum p (code x v_scale) = v_scale x sum p code: a quantized cache's V scale, on the weighted sum
  // (partial or final; the combine merges scaled partials).
  const float vs = head_scale(p.v_scale, p.v_scales, item.kv);
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    if (h >= w.nh) break;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] *= vs;
    if (item.finish) {  // the sequence's only split: out and lse directly
      const std::int64_t row = static_cast<std::int64_t>(qr[h].qrow) * p.num_heads + qr[h].head;
      const float fa = var.finish(st[h], qr[h].head);
      const float inv = st[h].inv_sum() * fa;
      const std::int64_t at =
          qr[h].qrow * p.out_stride + static_cast<std::int64_t>(qr[h].head) * D + w.l16 * E;
#pragma unroll
      for (int e = 0; e < E; ++e) store_out(p.out, p.out_dtype, at + e, acc[h][e] * inv);
      if (p.lse != nullptr && w.l16 == 0) p.lse[row] = st[h].lse();
      continue;
    }
    const std::int64_t pidx =
        part_base + static_cast<std::int64_t>(item.n_q - 1 - qr[h].back) * p.num_heads + qr[h].head;
    if (w.l16 == 0) {
      p.part_ml[2 * pidx] = st[h].m;
      p.part_ml[2 * pidx + 1] = st[h].l;
    }
    float* dst = p.part_acc + pidx * D + w.l16 * E;
#pragma unroll
    for (int e = 0; e < E; ++e) dst[e] = acc[h][e];
  }
}

// After the pipeline drained (smem: the stage area, now the merge scratch): the half-warps
// merged, the warps wt > 0 of each row group stashed in the scratch, and warp wt = 0 merging them
// in order wt = 1, 2, ... and writing the rows.
template <int D, typename V>
__device__ __forceinline__ void simt_epilogue(const SplitParams& p, const V& var,
                                              const CtaItem& item, std::int64_t part_base,
                                              SimtWarp w, const QueryRow (&qr)[kSimtRowsPerWarp],
                                              float (&acc)[kSimtRowsPerWarp][D / 16],
                                              SoftmaxState2 (&st)[kSimtRowsPerWarp],
                                              const float (&bad)[kSimtRowsPerWarp], char* smem) {
  constexpr int HW = kSimtRowsPerWarp, E = D / 16;
  simt_merge_halves<D>(acc, st, bad);
  float* scratch = reinterpret_cast<float*>(smem);
  constexpr int SROW = D + 2;
  if (w.wt > 0 && w.half == 0) {
#pragma unroll
    for (int h = 0; h < HW; ++h) {
      float* row = scratch + ((w.wh * (w.WT - 1) + w.wt - 1) * HW + h) * SROW;
      if (w.l16 == 0) {
        row[D] = st[h].m;
        row[D + 1] = st[h].l;
      }
#pragma unroll
      for (int e = 0; e < E; ++e) row[w.l16 * E + e] = acc[h][e];
    }
  }
  __syncthreads();
  if (w.wt == 0 && w.half == 0) {
    for (int v = 1; v < w.WT; ++v) {
#pragma unroll
      for (int h = 0; h < HW; ++h) {
        const float* row = scratch + ((w.wh * (w.WT - 1) + v - 1) * HW + h) * SROW;
        float fa, fb;
        if (!st[h].merge(SoftmaxState2{row[D], row[D + 1]}, fa, fb)) continue;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[h][e] = acc[h][e] * fa + row[w.l16 * E + e] * fb;
      }
    }
    simt_store<D>(p, var, item, part_base, w, qr, acc, st);
  }
}

}  // namespace pagedattn::detail::cuda
