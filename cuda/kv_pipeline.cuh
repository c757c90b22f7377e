// The KV pipeline of the split kernel: tiles of TT token rows of K and V copied from the paged
// cache into shared memory with cp.async, STAGES buffers deep, the page ids of each tile read
// from the block table STAGES - 1 tiles ahead of its compute. Both compute paths
// (mma_path.cuh, simt_path.cuh) run on it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ptx.cuh"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

// The dynamic shared memory follows the kernel's static shared variables, so its base is only
// 16-byte aligned; tiles start at the next 128-byte boundary, kSmemAlign bytes being reserved for
// it. Unaligned, every swizzled row segment would straddle a shared 128-byte boundary and the
// copy unit would fetch each global line in pieces, reading the L2 several times over
// (docs/cuda.md).
constexpr int kSmemAlign = 128;
__device__ __forceinline__ char* align_smem(char* p) {
  return p + ((kSmemAlign - (smem_u32(p) & (kSmemAlign - 1))) & (kSmemAlign - 1));
}

// Pipeline depth against CTAs per SM, by tile size. A large tile (>= 30 KB: 16-bit D >= 112,
// f32 D >= 112) keeps three stages, two tiles in flight per CTA, two CTAs per SM. A smaller tile
// gets about 52 KB of stages so four CTAs fit on an SM: more warps to overlap each warp's
// dependent compute. Large tiles keep their depth: with two stages they lose more than the
// extra CTA gains (docs/cuda.md).
constexpr int kDeepStageBudget = 106 * 1024;
constexpr int kWideStageBudget = 52 * 1024;
constexpr int stages_for_tile(int tile_bytes) {
  const int budget = tile_bytes >= 30 * 1024 ? kDeepStageBudget : kWideStageBudget;
  return budget / tile_bytes < 2 ? 2 : (budget / tile_bytes > 4 ? 4 : budget / tile_bytes);
}

// ---------------------------------------------------------------------------------------------
// Tile loading: TT token rows of K and V, each row D elements in CH 16-byte chunks.
//
// Rows of whole 128-byte segments (D * sizeof(T) a multiple of 128: head dims 64, 128, 192, 256
// in 16-bit types, 64, 96, 128, 192, 256 in f32) are stored swizzled: chunk c of row r sits at
// chunk c ^ (r & 7). Each global 128-byte line then lands in one aligned 128-byte shared segment
// (tiles start 128-byte aligned, see align_smem), which the copy unit serves with one L2 request,
// and chunk c of 8 consecutive rows falls in 8 different bank groups, so ldmatrix and row reads
// are free of bank conflicts. Rows padded by one chunk avoid the bank conflicts too, but every
// row then straddles shared 128-byte boundaries and the copy unit splits its lines, which makes
// the L2 the limit (docs/cuda.md). Rows of other sizes (head dims 80, 96, 112 in 16-bit types, 80
// and 112 in f32) keep one chunk of padding.
template <typename T, int D>
struct RowGeom {
  static constexpr int kChunks = D * static_cast<int>(sizeof(T)) / 16;
  static constexpr bool kSwizzle = kChunks % 8 == 0;
  static constexpr int kRowBytes = (kSwizzle ? kChunks : kChunks + 1) * 16;
  // Byte offset of chunk c of row r within a tile.
  static __device__ __forceinline__ int offset(int r, int c) {
    return r * kRowBytes + (kSwizzle ? (c ^ (r & 7)) : c) * 16;
  }
};

// The table entry of token t (read one pipeline iteration before its tile is issued, so the
// table's latency hides behind a tile's compute), or -1 past the split.
__device__ __forceinline__ int fetch_id(const SplitParams& p, const std::int32_t* row_table, int t,
                                        int tok_end) {
  return t < tok_end ? __ldg(row_table + p.block_div.div(static_cast<unsigned>(t))) : -1;
}

// Token t's row from the kv head's first row, in the layout's row units (SplitParams::row_unit
// bytes; below 2^31: the host checks the pool's span), or -1 when it must not be read (before
// the window, past the split, or a block id outside the pool: unchecked mode skips such tokens).
__device__ __forceinline__ int row_index(const SplitParams& p, int id, int t, int tok_lo,
                                         int tok_end) {
  if (t >= tok_end || t < tok_lo || id < 0 || id >= p.num_blocks) return -1;
  const int slot = t - static_cast<int>(p.block_div.div(static_cast<unsigned>(t))) * p.block_size;
  return id * p.block_units + slot * p.token_units;
}

// The byte offset of row index `row` (0 for -1, which is not read): one 32 x 32 -> 64-bit
// multiply, row indices being non-negative once checked.
__device__ __forceinline__ unsigned long long row_offset(int row, int unit) {
  return static_cast<unsigned long long>(static_cast<unsigned>(max(row, 0))) *
         static_cast<unsigned>(unit);
}

// Copies chunk c of tile row r of K and V (row index -1: zero fill).
template <typename T, int D>
__device__ __forceinline__ void copy_chunk(char* sK, char* sV, const int* s_row, int r, int c,
                                           const char* gK, long long v_minus_k, int unit) {
  const int row = s_row[r];
  const char* src = gK + row_offset(row, unit) + c * 16;
  const int dst = RowGeom<T, D>::offset(r, c);
  cp_async16_row(sK + dst, src, row);
  cp_async16_row(sV + dst, src + v_minus_k, row);
}

// Issues the cp.async copies of one tile; rows with index -1 are zero-filled (and flagged
// invalid in the tile's row mask, see KvPipeline). Each thread copies whole 16-byte chunks of a
// few rows at fixed positions: per row one shared-memory read of its index and one wide multiply,
// then its copies at constant distances (the next 128-byte segment, the V tile), so issuing a
// tile costs few instructions beyond the copies themselves; every thread does it every tile.
template <typename T, int D, int TT>
__device__ __forceinline__ void issue_tile(char* sK, char* sV, const int* s_row, const char* gK,
                                           long long v_minus_k, int unit) {
  constexpr int CH = RowGeom<T, D>::kChunks;
  if constexpr (CH % 8 == 0 && TT % (kThreads / 8) == 0) {
    // Eight lanes per 128-byte segment of a row, a warp on four rows of one segment: each
    // warp-wide copy is four whole global lines landing in four whole shared segments. A row's
    // chunk c sits at c ^ (r & 7) and r & 7 is fixed per thread, so the row's later segments are
    // at +128 bytes in shared memory as in global memory.
    // A row's byte offset is added to the K and V bases of the thread's chunk.
    constexpr int RP = kThreads / 8;  // rows per pass
    const int c0 = threadIdx.x % 8, r0 = threadIdx.x / 8;
    const char* gK0 = gK + c0 * 16;
    const char* gV0 = gK0 + v_minus_k;
#pragma unroll
    for (int k = 0; k < TT / RP; ++k) {
      const int r = r0 + k * RP;
      const int row = s_row[r];
      const unsigned long long off = row_offset(row, unit);
      const int dst = RowGeom<T, D>::offset(r, c0);
#pragma unroll
      for (int seg = 0; seg < CH / 8; ++seg) {
        cp_async16_row(sK + dst + seg * 128, gK0 + off + seg * 128, row);
        cp_async16_row(sV + dst + seg * 128, gV0 + off + seg * 128, row);
      }
    }
  } else if constexpr (kThreads % CH == 0) {
    constexpr int RP = kThreads / CH;  // rows per pass
    const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
#pragma unroll
    for (int k = 0; k < (TT + RP - 1) / RP; ++k) {
      const int r = r0 + k * RP;
      if (TT % RP == 0 || r < TT) copy_chunk<T, D>(sK, sV, s_row, r, c, gK, v_minus_k, unit);
    }
  } else {
    for (int idx = threadIdx.x; idx < TT * CH; idx += kThreads) {
      const int r = idx / CH;
      copy_chunk<T, D>(sK, sV, s_row, r, idx - r * CH, gK, v_minus_k, unit);
    }
  }
}

// The pipeline of one work item. Shared memory: STAGES tiles (K rows, then V rows) at `stages`,
// the row indices of each stage's tile (row_index, 4 bytes per row) at `rows_at`, and the tiles'
// row masks at `masks` (TT bits per tile, bit r set when row r holds a token to attend to).
// Row indices of tile n live in stage n % STAGES: computed from the table entries fetched at the
// top of iteration n - STAGES, written at its end, read when tile n is issued. The mask of tile
// n is written with them but read by the compute of tile n, so masks take a ring of STAGES + 1
// slots: slot n % (STAGES + 1) was last read by the compute of tile n - STAGES - 1, which every
// warp finished before the barrier of iteration n - STAGES.
// Each warp computes TT / kWarps of the rows (table entry, index, mask bits), so that work, which
// sits between two barriers, weighs the same on every warp.
// kTokenScales (a quantized cache on the CUDA cores, or the tensor cores' token-scale build): the
// pipeline also copies each tile's per-token K and V scales (SplitParams::k_token_scales, when
// set) into a ring of STAGES + 1 slots beside the masks, TT K scales then TT V scales per slot,
// 0 for rows not read. A tile's
// scales are issued with its row index (store_row), so they join the copy group of the tile
// itself (the next commit after end() is the one that issues that tile) and the same wait
// covers both; the ring is as deep as the masks' for the same reason.
template <typename T, int D, int TT, int STAGES, bool kTokenScales = false>
struct KvPipeline {
  static constexpr int kRowsPerWarp = TT / kWarps;
  static_assert(kRowsPerWarp == 8 || kRowsPerWarp == 16 || kRowsPerWarp == 32,
                "a warp's mask bits are one 8-, 16- or 32-bit store");
  using MaskPart = typename std::conditional<
      kRowsPerWarp == 8, std::uint8_t,
      typename std::conditional<kRowsPerWarp == 16, std::uint16_t, std::uint32_t>::type>::type;
  static constexpr int kRowBytes = RowGeom<T, D>::kRowBytes;
  static constexpr int kTileBytes = 2 * TT * kRowBytes;  // one stage: K rows, then V rows
  static constexpr int kMaskWords = TT / 32;
  static constexpr int kScaleFloats = kTokenScales ? (STAGES + 1) * 2 * TT : 0;
  // Shared bytes of the row indices, masks and token scales.
  static constexpr int kIndexBytes = (STAGES * TT + (STAGES + 1) * kMaskWords + kScaleFloats) * 4;

  char* stages;
  int* rows_at;
  unsigned* masks;
  const SplitParams* p;
  const std::int32_t* row_table;  // the sequence's block-table row
  const char* gK;                 // the kv head's K and V in block 0
  long long v_minus_k;            // gV - gK
  int unit;                       // bytes per row unit (SplitParams::row_unit)
  int tok_begin, tok_end, ntiles;
  int tok_lo;    // the window's first token (0 without one): rows before it are not read
  int last_pos;  // the last query token's position, L - 1 (ALiBi, the per-row masks)
  // kTokenScales: the ring (after the masks) and the kv head's K and V token scales in block 0
  // (null: the call has none, and the ring is not written).
  float* scale_ring;
  const float* gks;
  const float* gvs;

  __device__ __forceinline__ const char* k(int st) const { return stages + st * kTileBytes; }
  __device__ __forceinline__ const char* v(int st) const {
    return stages + st * kTileBytes + TT * kRowBytes;
  }
  // The row mask of tile `it` (kMaskWords words).
  __device__ __forceinline__ const unsigned* mask(int it) const {
    return masks + (it % (STAGES + 1)) * kMaskWords;
  }
  // The K token scales of tile `it` (TT floats), then its V token scales.
  __device__ __forceinline__ const float* token_scales(int it) const {
    return scale_ring + (it % (STAGES + 1)) * 2 * TT;
  }
  // Rows of tile `it` (the last tile of a split may be short).
  __device__ __forceinline__ int rows(int it) const {
    return min(TT, tok_end - (tok_begin + it * TT));
  }

  // Whether this thread computes a row, and which.
  static __device__ __forceinline__ bool has_row() { return (threadIdx.x & 31) < kRowsPerWarp; }
  static __device__ __forceinline__ int my_row() {
    return (threadIdx.x >> 5) * kRowsPerWarp + (threadIdx.x & 31);
  }
  __device__ __forceinline__ int tok_of(int n) const { return tok_begin + n * TT + my_row(); }
  __device__ __forceinline__ void issue(int n) {
    const int st = n % STAGES;
    char* base = stages + st * kTileBytes;
    issue_tile<T, D, TT>(base, base + TT * kRowBytes, rows_at + st * TT, gK, v_minus_k, unit);
  }
  // Row index and mask bit of tile n's row my_row() (every lane of the warp calls it; those
  // without a row pass has_row() == false).
  __device__ __forceinline__ void store_row(int n, int id) {
    const bool mine = has_row();
    const int row = mine ? row_index(*p, id, tok_of(n), tok_lo, tok_end) : -1;
    if (mine) rows_at[(n % STAGES) * TT + my_row()] = row;
    if constexpr (kTokenScales) {
      if (mine && gks != nullptr) {
        const int t = tok_of(n);
        const int slot =
            t - static_cast<int>(p->block_div.div(static_cast<unsigned>(t))) * p->block_size;
        // Offsets of rows that are read only: their block id is in the pool.
        const long long at = row < 0 ? 0 : id * p->ts_block + slot * p->ts_token;
        float* dst = scale_ring + (n % (STAGES + 1)) * 2 * TT + my_row();
        cp_async4_row(dst, gks + at, row);
        cp_async4_row(dst + TT, gvs + at, row);
      }
    }
    const unsigned bits = __ballot_sync(0xffffffffu, row >= 0);
    if ((threadIdx.x & 31) == 0) {
      reinterpret_cast<MaskPart*>(masks + (n % (STAGES + 1)) * kMaskWords)[threadIdx.x >> 5] =
          static_cast<MaskPart>(bits);
    }
  }

  // Row indices of the first STAGES tiles, then tiles 0 .. STAGES - 2 in flight.
  __device__ __forceinline__ void prologue() {
    int ids[STAGES];
#pragma unroll
    for (int n = 0; n < STAGES; ++n) {
      ids[n] = has_row() ? fetch_id(*p, row_table, tok_of(n), tok_end) : -1;
    }
#pragma unroll
    for (int n = 0; n < STAGES; ++n) store_row(n, ids[n]);
    __syncthreads();
    for (int n = 0; n < STAGES - 1; ++n) {
      if (n < ntiles) issue(n);
      cp_async_commit();
    }
  }
  // Top of iteration `it`: waits for tile it, fetches the table entry of tile it + STAGES and
  // issues tile it + STAGES - 1. Returns the fetched entry for end().
  __device__ __forceinline__ int begin(int it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int id = has_row() ? fetch_id(*p, row_table, tok_of(it + STAGES), tok_end) : -1;
    if (it + STAGES - 1 < ntiles) issue(it + STAGES - 1);
    cp_async_commit();
    return id;
  }
  // Bottom of iteration `it`: the row indices and mask of tile it + STAGES.
  __device__ __forceinline__ void end(int it, int id) { store_row(it + STAGES, id); }
  // After the last tile: nothing in flight, so the stage area can become scratch.
  __device__ __forceinline__ void drain() {
    cp_async_wait<0>();
    __syncthreads();
  }
};

}  // namespace pagedattn::detail::cuda
