// The CUDA-core path's shapes and the state its steps share (simt_path.cuh): the CTA's shared
// memory (SimtCfg), each warp's place among the CTA's rows and a tile's tokens (SimtWarp) and the
// warp's query rows (SimtRows).
//
// The steps take this state as arguments: small views by value, arrays and the per-item
// structs by reference. Which argument goes which way follows the code as it was when the item
// was one function, so the inlined steps compile to the same registers and spills; changing
// it changes the generated code (measure with -Xptxas -v before and after).
#pragma once

#include "kv_pipeline.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

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
  // A quantized cache's per-token scales come through the pipeline (kv_pipeline.cuh).
  using Pipe = KvPipeline<T, D, TT, STAGES, is_quantized_type<T>>;
  static constexpr int SMEM = STAGE_AREA + QBYTES + Pipe::kIndexBytes + kSmemAlign;
};

// A warp's place in the CTA: with R rows, WH groups of HW = kSimtRowsPerWarp rows (1, 2 or 4)
// and WT = 4 / WH warps per group, which take the token pairs wt, wt + WT, ... of every tile.
// Each half-warp takes one token of a pair, each lane (l16) E = D / 16 elements of the head
// dim. The warp holds rows h_first .. h_first + nh - 1 (nh < HW for a small group).
struct SimtWarp {
  static constexpr int HW = kSimtRowsPerWarp;
  int lane, WH, WT, wh, wt, half, l16, h_first, nh;
  __device__ __forceinline__ explicit SimtWarp(int R)
      : lane(static_cast<int>(threadIdx.x) & 31),
        WH(R <= HW ? 1 : (R <= 2 * HW ? 2 : 4)),
        WT(kWarps / WH),
        wh((static_cast<int>(threadIdx.x) >> 5) / WT),
        wt((static_cast<int>(threadIdx.x) >> 5) % WT),
        half(lane >> 4),
        l16(lane & 15),
        h_first(wh * HW),
        nh(max(0, min(HW, R - h_first))) {}
};

// The warp's query rows, fixed for the item: each lane's E elements of q (scaled into log2
// units) and the variant policy's constants of each row (V::Row).
template <int D, typename V>
struct SimtRows {
  static constexpr int HW = kSimtRowsPerWarp, E = D / 16;
  QueryRow qr[HW];
  float q[HW][E];
  typename V::Row vrow[HW];
  int tree_at;  // the sequence's tree mask (tree_mask_at), -1: none
};

}  // namespace pagedattn::detail::cuda
