// The CUDA-core path (f32 caches, or q in another dtype than the cache): a half-warp
// per token, each lane 1/16 of the head dim, up to 4 rows (query token x query head; see
// query_rows.cuh) per warp (scores only for the rows a warp holds), per-token online softmax in
// f32. More than 16 rows run in row chunks of 16, one CTA each (K/V read once per chunk, from L2
// for all but the first).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "fp8_convert.cuh"
#include "kv_pipeline.cuh"
#include "logit_variants.cuh"
#include "pagedattn/dtype.hpp"
#include "pagedattn/online_softmax.hpp"
#include "ptx.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"
#include "store_out.cuh"

namespace pagedattn::detail::cuda {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(fp8_e4m3_t x) { return fp8_e4m3_to_float(x); }
__device__ __forceinline__ float to_f(fp8_e5m2_t x) { return fp8_e5m2_to_float(x); }

__device__ __forceinline__ float load_q(const void* q, int dtype, std::int64_t i) {
  if (dtype == 0) return static_cast<const float*>(q)[i];
  if (dtype == 1) return __half2float(static_cast<const __half*>(q)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(q)[i]);
}

// Lane l16's E elements of row r of a tile (words never straddle a 16-byte chunk, so each is
// found through the tile's chunk layout).
template <typename T, int D, int E>
__device__ __forceinline__ void load_slice(const char* tile, int r, int l16, float (&out)[E]) {
  constexpr int kBytes = E * static_cast<int>(sizeof(T));
  constexpr int kAlign = kBytes % 16 == 0  ? 16
                         : kBytes % 8 == 0 ? 8
                         : kBytes % 4 == 0 ? 4
                         : kBytes % 2 == 0 ? 2
                                           : 1;  // fp8 with an odd E (head dims 80, 112)
  constexpr int kWords = kBytes / kAlign;
  using W = typename std::conditional<
      kAlign == 16, uint4,
      typename std::conditional<
          kAlign == 8, uint2,
          typename std::conditional<kAlign == 4, std::uint32_t,
                                    typename std::conditional<kAlign == 2, std::uint16_t,
                                                              std::uint8_t>::type>::type>::type>::
      type;
  W w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const int byte = l16 * kBytes + i * kAlign;
    w[i] = *reinterpret_cast<const W*>(tile + RowGeom<T, D>::offset(r, byte / 16) + byte % 16);
  }
  if constexpr (is_fp8_type<T>) {
    // Two codes at a time through f16 (exact: fp8_convert.cuh).
    constexpr __nv_fp8_interpretation_t kKind =
        std::is_same_v<T, fp8_e4m3_t> ? __NV_E4M3 : __NV_E5M2;
    const std::uint8_t* b = reinterpret_cast<const std::uint8_t*>(w);
#pragma unroll
    for (int i = 0; i + 1 < E; i += 2) {
      const __nv_fp8x2_storage_t pair =
          static_cast<__nv_fp8x2_storage_t>(b[i] | (static_cast<unsigned>(b[i + 1]) << 8));
      const __half2 h = fp8x2_to_half2(pair, kKind);
      const float2 f = __half22float2(h);
      out[i] = f.x;
      out[i + 1] = f.y;
    }
    if constexpr (E % 2 != 0) out[E - 1] = __half2float(__nv_cvt_fp8_to_halfraw(b[E - 1], kKind));
  } else {
    const T* e = reinterpret_cast<const T*>(w);
#pragma unroll
    for (int i = 0; i < E; ++i) out[i] = to_f(e[i]);
  }
}

template <typename T, int D>
struct SimtCfg {
  static constexpr int TT = 32;
  static constexpr int ROW = RowGeom<T, D>::kRowBytes;
  static constexpr int TILE = 2 * TT * ROW;
  static constexpr int STAGES = stages_for_tile(TILE);
  static constexpr int E = D / 16;
  static constexpr int SCRATCH = kWarps * kSimtRowsPerWarp * (D + 2) * 4;
  static constexpr int STAGE_AREA = STAGES * TILE > SCRATCH ? STAGES* TILE : SCRATCH;
  static constexpr int QBYTES = 0;
  using Pipe = KvPipeline<T, D, TT, STAGES>;
  static constexpr int SMEM = STAGE_AREA + QBYTES + Pipe::kIndexBytes + kSmemAlign;
};

// kMulti: the item's sequence has several query tokens (item.n_q > 1). One-token decode runs the
// kMulti = false instance, where the per-row causal tests and the row arithmetic fold away.
template <typename T, int D, bool kMulti>
__device__ __forceinline__ void simt_item(const SplitParams& p, const CtaItem& item,
                                          typename SimtCfg<T, D>::Pipe& pipe, char* smem) {
  using Cfg = SimtCfg<T, D>;
  constexpr int STAGES = Cfg::STAGES;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::int64_t part_base = item.part_base;
  constexpr int E = D / 16;
  constexpr int HW = kSimtRowsPerWarp;
  const int R = item.rows;
  const int WH = R <= HW ? 1 : (R <= 2 * HW ? 2 : 4);
  const int WT = kWarps / WH;
  const int wh = warp / WT, wt = warp % WT;
  const int half = lane >> 4, l16 = lane & 15;
  const int h_first = wh * HW;  // first row of this warp
  const int nh = max(0, min(HW, R - h_first));
  QueryRow qr[HW];
#pragma unroll
  for (int h = 0; h < HW; ++h) qr[h] = query_row<kMulti>(p, item, h_first + h);
  // q . (code x k_scale) = (q x k_scale) . code: an fp8 cache's K scale joins the logit scale.
  const float q_scale = p.scale_log2 * head_scale(p.k_scale, p.k_scales, item.kv);
  float q[HW][E];
#pragma unroll
  for (int h = 0; h < HW; ++h) {
    const std::int64_t at = qr[h].qrow * p.q_stride + static_cast<std::int64_t>(qr[h].head) * D;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      q[h][e] = h < nh ? load_q(p.q, p.q_dtype, at + l16 * E + e) * q_scale : 0.f;
    }
  }
  float slope2[HW];  // ALiBi, log2 units (0 without)
#pragma unroll
  for (int h = 0; h < HW; ++h) slope2[h] = alibi_slope2(p, qr[h].head, h < nh);
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
    const int rows = nh > 0 ? pipe.rows(it) : 0;
    const char* kS = pipe.k(stage);
    const char* vS = pipe.v(stage);
    const unsigned* tile_mask = pipe.mask(it);
    for (int r0 = wt * 2; r0 < rows; r0 += 2 * WT) {
      const int r = r0 + half;  // r < TT always; rows past `rows` are masked
      const bool ok = (tile_mask[r >> 5] >> (r & 31)) & 1u;
      const int t = pipe.tok_begin + it * Cfg::TT + r;
      float kr[E];
      load_slice<T, D, E>(kS, r, l16, kr);
      float sc[HW];
      bool att[HW];
#pragma unroll
      for (int h = 0; h < HW; ++h) {
        if (h >= nh) break;  // warp-uniform: a small group leaves a warp's last slots empty
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) d = fmaf(q[h][e], kr[e], d);
#pragma unroll
        for (int o2 = 8; o2 > 0; o2 >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o2);
        // Whether the row attends to the token: with several query tokens, each row's own
        // causal bound and window (the tile mask covers the earliest query's window).
        att[h] = ok && (!kMulti || item.n_q == 1 ||
                        row_attends(t, pipe.last_pos, qr[h].back, p.plan.window_left));
        // x * 0 is 0 for a finite logit, NaN otherwise.
        bad[h] = fmaf(att[h] ? d : 0.f, 0.f, bad[h]);
        if (p.logit_variant) {  // uniform
          d = variant_logit(p, d, slope2[h], t - pipe.last_pos + qr[h].back);
        }
        sc[h] = d;
      }
      if (ok) {  // per half-warp; no shuffles inside
        float vr[E];
        load_slice<T, D, E>(vS, r, l16, vr);
#pragma unroll
        for (int h = 0; h < HW; ++h) {
          if (h >= nh) break;
          // A token the row does not attend to is skipped, not weighted 0: 0 x a non-finite V
          // would be NaN.
          if (!att[h]) continue;
          const float alpha = st[h].rescale_to(sc[h]);
          const float pr = st[h].weight(sc[h]);
          st[h].add(pr);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[h][e] = fmaf(pr, vr[e], acc[h][e] * alpha);
        }
      }
    }
    pipe.end(it, next_id);
  }
  pipe.drain();  // the stage area becomes the merge scratch
  // Merge the two half-warps (lanes l and l ^ 16 hold the same elements). A non-finite logit
  // first makes the head's state NaN (m = l = NaN), which every merge after this one, and the
  // combine, carry through to out and lse (as the CPU backend does).
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

  float* scratch = reinterpret_cast<float*>(smem);
  constexpr int SROW = D + 2;
  if (wt > 0 && half == 0) {
#pragma unroll
    for (int h = 0; h < HW; ++h) {
      float* row = scratch + ((wh * (WT - 1) + wt - 1) * HW + h) * SROW;
      if (l16 == 0) {
        row[D] = st[h].m;
        row[D + 1] = st[h].l;
      }
#pragma unroll
      for (int e = 0; e < E; ++e) row[l16 * E + e] = acc[h][e];
    }
  }
  __syncthreads();
  if (wt == 0 && half == 0) {
    for (int w = 1; w < WT; ++w) {
#pragma unroll
      for (int h = 0; h < HW; ++h) {
        const float* row = scratch + ((wh * (WT - 1) + w - 1) * HW + h) * SROW;
        float fa, fb;
        if (!st[h].merge(SoftmaxState2{row[D], row[D + 1]}, fa, fb)) continue;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[h][e] = acc[h][e] * fa + row[l16 * E + e] * fb;
      }
    }
    // sum p (code x v_scale) = v_scale x sum p code: an fp8 cache's V scale, on the weighted sum
    // (partial or final; the combine merges scaled partials).
    const float vs = head_scale(p.v_scale, p.v_scales, item.kv);
#pragma unroll
    for (int h = 0; h < HW; ++h) {
      if (h >= nh) break;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] *= vs;
      if (item.finish) {  // the sequence's only split: out and lse directly
        const std::int64_t row = static_cast<std::int64_t>(qr[h].qrow) * p.num_heads + qr[h].head;
        const float fa = fold_sink(p, st[h], qr[h].head);  // the sink: denominator only
        const float inv = st[h].inv_sum() * fa;
        const std::int64_t at =
            qr[h].qrow * p.out_stride + static_cast<std::int64_t>(qr[h].head) * D + l16 * E;
#pragma unroll
        for (int e = 0; e < E; ++e) store_out(p.out, p.out_dtype, at + e, acc[h][e] * inv);
        if (p.lse != nullptr && l16 == 0) p.lse[row] = st[h].lse();
        continue;
      }
      const std::int64_t pidx = part_base +
                                static_cast<std::int64_t>(item.n_q - 1 - qr[h].back) * p.num_heads +
                                qr[h].head;
      if (l16 == 0) {
        p.part_ml[2 * pidx] = st[h].m;
        p.part_ml[2 * pidx + 1] = st[h].l;
      }
      float* dst = p.part_acc + pidx * D + l16 * E;
#pragma unroll
      for (int e = 0; e < E; ++e) dst[e] = acc[h][e];
    }
  }
}

}  // namespace pagedattn::detail::cuda
