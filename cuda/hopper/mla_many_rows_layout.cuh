// The sm_90 MLA kernel's shapes, shared storage and the facts of a CTA's tiles that its producer
// warp and its two consumer warpgroups both read (mla_many_rows.cu).
//
// A latent row of 576 16-bit values is stored as nine 64-column parts (eight of c, one of k_pe),
// each part of a 64-row tile being 64 rows of 128 bytes, 128-byte swizzled: the layout TMA writes
// and wgmma reads, K-major for S = Q K^T and MN-major for O += P c. Q is stored the same way.
// An 8-bit cache lands as codes in a raw stage (two 256-column boxes of c and one of k_pe per
// page, unswizzled) and is widened exactly into the one 16-bit tile the MMAs read.
#pragma once

#include <cstdint>

#include "../mla/mla_params.cuh"
#include "../mla/mla_tiles.cuh"

namespace pagedattn::detail::cuda::mla::sm90 {

constexpr int kRank = 512;                    // kv_lora_rank: O's columns
constexpr int kRope = 64;                     // rope_dim: one more part of every row
constexpr int kParts = (kRank + kRope) / 64;  // 64-column parts of a row
constexpr int kCParts = kRank / 64;           // of which c's
constexpr int kPartBytes = 64 * 128;          // one part of a 64-row tile
constexpr int kTileBytes = kParts * kPartBytes;
constexpr int kRowsPerCta = 64;              // one wgmma M tile of query rows
constexpr int kKeys = 64;                    // latent rows per tile
constexpr int kStages = 2;                   // what fits beside Q in 227 KB
constexpr int kGroups = 2;                   // consumer warpgroups
constexpr int kGroupKeys = kKeys / kGroups;  // keys of S per group
constexpr int kGroupCols = kRank / kGroups;  // columns of O per group
constexpr int kConsumers = 128 * kGroups;
// And a producer warpgroup, of which one thread copies: register limits are shared out per
// warpgroup (setmaxnreg), so the producer gives its registers to the consumers.
constexpr int kThreads = kConsumers + 128;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumers <= 65536, "one CTA per SM");
static_assert(kKeys == kTileKeys, "splits are cut in the 16-row kernel's tiles");
constexpr int kRawBoxCols = 256;                    // an 8-bit box's columns of c
constexpr int kRawBytes = kKeys * (kRank + kRope);  // one raw stage of codes
static_assert(2 * kRawBytes == kTileBytes, "8-bit caches: kv[1] holds the two raw stages");

// Every tile starts on a 1024-byte boundary: the swizzle pattern repeats every 8 rows of 128
// bytes and is taken from the shared-memory address.
struct alignas(1024) Storage {
  char q[kTileBytes];
  char kv[kStages][kTileBytes];  // 16-bit tiles; 8-bit caches: kv[0] the tile, kv[1] raw stages
  char p[kPartBytes];            // P: 64 rows x 64 keys, K-major, swizzled
  float row_max[kGroups][kRowsPerCta];  // each group's tile max per row (raw scores)
  float row_sum[kRowsPerCta];           // the second group's share of l, at the end
  std::uint32_t bad_keys[kGroups];      // per group: its keys with a value that must not be read
  std::uint64_t full[kStages];          // producer -> consumers: the stage's copies landed
  std::uint64_t empty[kStages];         // consumers -> producer: every consumer warp is done
};

// Where the MMAs read tile t (stage s) and where the producer lands it.
template <typename KV>
__device__ __forceinline__ char* mma_tile(Storage& sm, int s) {
  return sizeof(KV) == 1 ? sm.kv[0] : sm.kv[s];
}
__device__ __forceinline__ char* raw_stage(Storage& sm, int s) { return sm.kv[1] + s * kRawBytes; }

// Pages of min(block_size, 64) tokens: a tile is 64 / page_rows pages or part of one page.
struct Pages {
  int rows;      // tokens per TMA box
  int per_tile;  // 1 .. 8
};
__host__ __device__ inline Pages tile_pages(int block_size) {
  const int rows = block_size < kKeys ? block_size : kKeys;
  return {rows, kKeys / rows};
}

// Whether page i of the tile of keys from key0 is copied: it holds keys of the split and its
// block id lies inside the pool. Producer and consumers decide it from the same id.
__device__ __forceinline__ bool page_copied(const MlaParams& p, const MlaWork& w, int key0, int i,
                                            int page_rows, int id) {
  return key0 + i * page_rows < w.tok_end && id >= 0 && id < p.num_blocks;
}

// The block id of page i of the tile from key0 (read only where the page holds split keys).
__device__ __forceinline__ int page_id(const MlaParams& p, const MlaWork& w, int key0, int i,
                                       int page_rows) {
  const int page = (key0 + i * page_rows) / p.block_size;
  return __ldg(p.table + static_cast<long long>(w.b) * p.table_stride + page);
}

// The tile's copied pages, one bit each.
__device__ inline std::uint32_t pages_copied(const MlaParams& p, const MlaWork& w, int key0) {
  const Pages g = tile_pages(p.block_size);
  std::uint32_t ok = 0;
  for (int i = 0; i < g.per_tile; ++i) {
    if (key0 + i * g.rows >= w.tok_end) break;
    if (page_copied(p, w, key0, i, g.rows, page_id(p, w, key0, i, g.rows))) ok |= 1u << i;
  }
  return ok;
}

}  // namespace pagedattn::detail::cuda::mla::sm90
