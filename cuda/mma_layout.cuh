// The tensor-core path's shapes and the state its steps share (mma_path.cuh): the CTA's shared
// memory (MmaCfg), each warp's place among the CTA's rows and a tile's token slices (MmaWarp),
// a tile of the KV pipeline (MmaTile) and Q in shared memory as ldmatrix reads it (MmaQSmem).
//
// The steps take this state as arguments: small views by value, arrays and the per-item
// structs by reference. Which argument goes which way follows the code as it was when the item
// was one function, so the inlined steps compile to the same registers and spills; changing
// it changes the generated code (measure with -Xptxas -v before and after).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kv_pipeline.cuh"
#include "pagedattn/dtype.hpp"
#include "split_params.cuh"
#include "tf32_frags.cuh"

namespace pagedattn::detail::cuda {

// Head dims with a tensor-core kernel for cache type T: every one for f16 and bf16, multiples of
// 32 for fp8 (each ldmatrix covers two 16-code chunks), and kTf32HeadDim for f32.
template <typename T, int D>
constexpr bool kMmaHeadDim = is_quantized_type<T>
                                 ? D % 32 == 0
                                 : (std::is_same_v<T, float> ? kTf32HeadDim<D> : true);

// kTokenScales: the pipeline also carries each tile's per-token scales (SplitBuild::token_scales).
template <typename T, int D, bool kTokenScales = false>
struct MmaCfg {
  // Quantized caches (fp8, int8) keep 8-bit code tiles and widen the fragments to f16
  // (fp8_frags.cuh); f32 caches run 3xTF32 (tf32_frags.cuh).
  static constexpr bool kCodes = is_quantized_type<T>;
  static constexpr bool kTf32 = std::is_same_v<T, float>;
  using MmaT = typename std::conditional<kCodes, __half, T>::type;
  static constexpr int TT = 64;  // 4 slices of 16 tokens
  static constexpr int ROW = RowGeom<T, D>::kRowBytes;
  static constexpr int TILE = 2 * TT * ROW;
  static constexpr int STAGES = stages_for_tile(TILE);
  // Q fragments live in registers up to D = 128 for 16-bit caches; larger head dims read them
  // from shared memory, as rows in the tile layout (ldmatrix). The fp8 path keeps its converted
  // fragments there at every head dim (16 bytes per lane, k-step and row tile): its widening
  // needs registers of its own. So does the tf32 path, its fragments split into hi and lo
  // (32 bytes per lane, k-step and row tile), for its one row tile.
  static constexpr bool kQInSmem = kCodes || kTf32 || D > 128;
  static constexpr int kQK = kQInSmem ? 1 : D / 16;  // k-steps of Q fragments in registers
  // Up to 4 row tiles of 16; one for f32 (kTf32RowsPerCta).
  static constexpr int QROWS = kTf32 ? kTf32RowsPerCta : kMmaRowsPerCta;
  static constexpr int SCRATCH = kWarps * 16 * (D + 2) * 4;
  static constexpr int STAGE_AREA = STAGES * TILE > SCRATCH ? STAGES* TILE : SCRATCH;
  static constexpr int QBYTES =
      !kQInSmem ? 0
                : (kTf32 ? QROWS / 16 * kTf32QBytesPerRowTile<D>
                         : (kCodes ? QROWS / 16 * (D / 16) * 32 * 16 : QROWS * ROW));
  using Pipe = KvPipeline<T, D, TT, STAGES, kTokenScales>;
  static constexpr int SMEM = STAGE_AREA + QBYTES + Pipe::kIndexBytes + kSmemAlign;
};

// A warp's place in the CTA: with R rows, WH row tiles of 16 (1, 2 or 4) and WT = 4 / WH warps
// per row tile, which take its 16-token slices wt, wt + WT, ... of every tile. Lane (g, q4)
// holds rows g and g + 8 of the warp's row tile and columns 2 q4, 2 q4 + 1 of each n-tile.
struct MmaWarp {
  int tid, lane, WH, WT, wh, wt, g, q4;
  __device__ __forceinline__ explicit MmaWarp(int R)
      : tid(threadIdx.x),
        lane(tid & 31),
        WH(R <= 16 ? 1 : (R <= 32 ? 2 : 4)),
        WT(kWarps / WH),
        wh((tid >> 5) / WT),
        wt((tid >> 5) % WT),
        g(lane >> 2),
        q4(lane & 3) {}
};

// One tile of the KV pipeline: K and V in shared memory, its row masks (KvPipeline::mask), its
// first token and, in the token-scale build, its scales (KvPipeline::token_scales; else null).
struct MmaTile {
  const char* k;
  const char* v;
  const unsigned* mask;
  int t0;
  const float* scales;
};

// Q in shared memory (MmaCfg::kQInSmem): its base, and the (row, chunk pair) of the lane's 8x8
// matrix row for ldmatrix; k-step `step` reads chunk 2 * step + half.
struct MmaQSmem {
  char* base;
  int row, half;
};

}  // namespace pagedattn::detail::cuda
