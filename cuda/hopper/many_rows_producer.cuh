// The many-row kernel's producer warp: reads the block table 32 pages at a time (one page id
// per lane) and copies each tile's pages of K and V with TMA into the stage ring. A page is
// copied only when it holds keys of the item and its block id lies inside the pool
// (page_copied); the consumers find the same pages from the table and mask the others, unchecked
// mode's rule for out-of-range ids.
#pragma once

#include <cuda.h>

#include "many_rows_layout.cuh"
#include "sm90_ptx.cuh"

namespace pagedattn::detail::cuda::sm90 {

// The page ids of a window of 32 consecutive pages of the sequence, lane L holding page
// first + L (-1 for a page past the item's keys).
struct TableWindow {
  const std::int32_t* row_table;
  int first = 0, id = -1;
  bool loaded = false;

  // The id of page `page` (whose window must hold pages page .. page + ahead - 1); every lane
  // of the warp calls it with the same arguments.
  __device__ int id_of(int page, int ahead, int tok_end, int block_size) {
    if (!loaded || page < first || page + ahead > first + 32) {
      first = page;
      loaded = true;
      const int mine = first + static_cast<int>(threadIdx.x % 32);
      id = mine * block_size < tok_end ? __ldg(row_table + mine) : -1;
    }
    return __shfl_sync(0xffffffffu, id, page - first);
  }
};

// The n-th use of a stage waits until the consumers released its use n - kStages.
__device__ __forceinline__ void wait_free(std::uint64_t* empty, int n) {
  if (n >= kStages) mbar_wait(empty, ((n / kStages) + 1) & 1);
}

template <typename T>
__device__ void produce_tiles(SharedStorage<T>& sm, const CUtensorMap* map_k,
                              const CUtensorMap* map_v, const SplitParams& p, const TileWork& tw) {
  const int lane = threadIdx.x % 32;
  const PageGeom g = page_geom(p.block_size);
  const std::uint32_t page_bytes = 2u * 2u * g.page_rows * 128u;  // K and V, both halves
  TableWindow win{p.table + static_cast<std::int64_t>(tw.w.item.seq) * p.table_stride};
  for (int t = 0; t < tw.tiles; ++t) {
    const int key0 = tw.w.tok_begin + t * kTileKeys;
    const int page0 = static_cast<int>(p.block_div.div(static_cast<unsigned>(key0)));
    const int slot0 = key0 - page0 * p.block_size;  // non-zero only within pages of > 64 keys
    int ids[4];
    std::uint32_t ok = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ids[i] = -1;
      if (i < g.pages_per_tile) {
        ids[i] = win.id_of(page0 + i, g.pages_per_tile, tw.w.tok_end, p.block_size);
        if (page_copied(p, tw, key0, i, g.page_rows, ids[i])) ok |= 1u << i;
      }
    }
    const int s = t % kStages;
    wait_free(&sm.empty[s], t);
    if (lane == 0) {
      mbar_arrive_expect_tx(&sm.full[s], __popc(ok) * page_bytes);
#pragma unroll
      for (int i = 0; i < 4; ++i) {             // unrolled so that ids stays in registers
        if (!(ok & (1u << i))) continue;        // bits past pages_per_tile are clear
        const int row0 = i * g.page_rows * 64;  // elements from the tile's start
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int off = h * (kHalfBytes / 2) + row0;
          tma_load_4d(sm.k[s] + off, map_k, h * 64, slot0, ids[i], tw.w.item.kv, &sm.full[s]);
          tma_load_4d(sm.v[s] + off, map_v, h * 64, slot0, ids[i], tw.w.item.kv, &sm.full[s]);
        }
      }
    }
  }
}

}  // namespace pagedattn::detail::cuda::sm90
