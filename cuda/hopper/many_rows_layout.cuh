// The many-row kernel's shapes and shared storage, and the facts of a CTA's work that both of its
// roles read. One CTA holds up to 64 query rows of one kv head (SplitParams::rows_per_cta, the
// tensor-core path's row chunk) as one wgmma M tile and walks its item's keys in tiles of 64:
// a producer warp copies each tile's pages of K and V with TMA into a ring of stages, one
// consumer warpgroup computes S = Q K^T, the online softmax and O += P V (docs/cuda.md).
#pragma once

#include <cstdint>

#include "../device_plan.cuh"
#include "../split_params.cuh"

namespace pagedattn::detail::cuda::sm90 {

constexpr int kHeadDim = 128;  // the one head dim with a many-row kernel
constexpr int kRows = 64;      // query rows per CTA: one wgmma M tile
constexpr int kTileKeys = 64;  // keys per stage
// Three stages keep two CTAs per SM within the SM's 228 KB of shared memory.
constexpr int kStages = 3;
constexpr int kConsumers = 128;                   // one consumer warpgroup
constexpr int kCtaThreads = kConsumers + 32;      // and one producer warp
constexpr int kHalfBytes = kTileKeys * 128;       // one 64-column half of a 64-row 16-bit tile
constexpr int kTileElems = kTileKeys * kHeadDim;  // elements of one K, V or Q tile
static_assert(kRows == kMmaRowsPerCta, "the plan cuts rows as the tensor-core path does");

// Operand tiles are two 64-column halves (128-byte rows, 128-byte swizzled) stacked; every tile
// starts on a 1024-byte boundary, as the swizzle pattern repeats every 8 rows of 128 bytes and
// is taken from the shared-memory address. The kernel has no other shared variables, so the
// dynamic shared memory (and the storage) starts at the 1024-byte aligned window base.
template <typename T>
struct alignas(1024) SharedStorage {
  T q[kTileElems];
  T k[kStages][kTileElems];
  T v[kStages][kTileElems];
  std::uint64_t full[kStages];   // producer -> consumers: the stage's copies have landed
  std::uint64_t empty[kStages];  // consumers -> producer: every consumer warp is done with it
  // The keys of an edge tile whose V holds a non-finite value (guard_nonfinite_v), one word per
  // parity of the edge tiles met; zero at the start.
  unsigned long long nonfinite_keys[2];
  PlanScratch<kCtaThreads> plan;
};

// Keys come in pages of min(block_size, 64) tokens: a tile of 64 keys is 64 / that many pages
// (block sizes 16 and 32), or part of one page (64 and more). The host builds the tensor maps
// with boxes of page_rows rows.
struct PageGeom {
  int page_rows;       // rows of one TMA box
  int pages_per_tile;  // 1, 2 or 4
};
__host__ __device__ inline PageGeom page_geom(int block_size) {
  const int rows = block_size < kTileKeys ? block_size : kTileKeys;
  return {rows, kTileKeys / rows};
}

// What every thread of a CTA knows of its work: the item, its tiles of keys from tok_begin, and
// the keys that every row attends (all_lo .. all_hi): a tile inside those bounds with all its
// pages copied needs no mask.
struct TileWork {
  CtaWork w;
  int tiles;
  int all_lo, all_hi;
};

// The attended range of the row `back` positions before the last query: tokens
// [pos - window_left, pos] (no lower bound without a window) within [tok_lo, tok_end).
__device__ inline void row_bounds(const SplitParams& p, const CtaWork& w, int back, int* lo,
                                  int* hi) {
  const int pos = w.len - 1 - back;
  *lo = p.plan.window_left < 0 ? w.tok_lo : max(w.tok_lo, pos - p.plan.window_left);
  *hi = min(pos, w.tok_end - 1);
}

__device__ inline TileWork tile_work(const SplitParams& p, const CtaWork& w) {
  TileWork t;
  t.w = w;
  t.tiles = (w.tok_end - w.tok_begin + kTileKeys - 1) / kTileKeys;
  // Rows are query-token major: the first row's token sees the fewest keys at the top, the last
  // row's token the fewest at the bottom (with a window).
  const int first_tok = w.item.row_begin / p.group;
  const int last_tok = (w.item.row_begin + w.item.rows - 1) / p.group;
  int lo = 0, hi = 0;
  row_bounds(p, w, w.item.n_q - 1 - first_tok, &lo, &hi);
  t.all_hi = hi;
  row_bounds(p, w, w.item.n_q - 1 - last_tok, &lo, &hi);
  t.all_lo = lo;
  // A tree mask may drop any new token from any row.
  if (p.tree_mask != nullptr) t.all_hi = min(t.all_hi, w.len - w.item.n_q - 1);
  return t;
}

// Whether page i of the tile of keys from key0 is copied: it holds keys of the item and its
// block id lies inside the pool. The producer and the consumers each decide it from the id, so
// no flag passes between them through shared memory.
__device__ __forceinline__ bool page_copied(const SplitParams& p, const TileWork& tw, int key0,
                                            int i, int page_rows, int id) {
  return key0 + i * page_rows < tw.w.tok_end && id >= 0 && id < p.num_blocks;
}

// The tile's copied pages (one bit each) as the consumers find them, reading the ids from the
// block table (the same few ids for every thread: one cached line).
__device__ inline std::uint32_t tile_pages_copied(const SplitParams& p, const TileWork& tw,
                                                  int key0) {
  const PageGeom g = page_geom(p.block_size);
  const std::int32_t* row = p.table + static_cast<std::int64_t>(tw.w.item.seq) * p.table_stride;
  const int page0 = static_cast<int>(p.block_div.div(static_cast<unsigned>(key0)));
  std::uint32_t ok = 0;
  for (int i = 0; i < g.pages_per_tile; ++i) {
    if (key0 + i * g.page_rows >= tw.w.tok_end) break;
    if (page_copied(p, tw, key0, i, g.page_rows, __ldg(row + page0 + i))) ok |= 1u << i;
  }
  return ok;
}

}  // namespace pagedattn::detail::cuda::sm90
