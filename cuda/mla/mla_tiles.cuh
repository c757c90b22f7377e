// The MLA kernel's work and tiles (mla_kernel.cuh): what a CTA works on, the copies of a tile of
// latent rows into shared memory, the widening of 8-bit codes and the guard of keys with
// non-finite values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../fp8_convert.cuh"
#include "../ptx.cuh"
#include "../query_rows.cuh"
#include "mla_params.cuh"
#if __CUDA_ARCH__ >= 900
#include "../hopper/sm90_ptx.cuh"
#endif
#include "pagedattn/dtype.hpp"
#include "pagedattn/online_softmax.hpp"

namespace pagedattn::detail::cuda::mla {

__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}

// Two cache codes (low byte first) as a pair of T, exactly: every e4m3 and e5m2 value is an f16
// and a bf16 value.
template <typename T, typename KV>
__device__ __forceinline__ std::uint32_t widen_pair(std::uint32_t two) {
  constexpr __nv_fp8_interpretation_t kind = std::is_same_v<KV, fp8_e4m3_t> ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h = fp8x2_to_half2(static_cast<__nv_fp8x2_storage_t>(two), kind);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
  } else {
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 bf = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const std::uint32_t*>(&bf);
  }
}

// 16 cache codes as 8 pairs of T (widen_pair), in order.
template <typename T, typename KV>
__device__ __forceinline__ void widen_codes(uint4 codes, std::uint32_t (&wide)[8]) {
  const std::uint32_t in[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    wide[2 * i] = widen_pair<T, KV>(in[i] & 0xffffu);
    wide[2 * i + 1] = widen_pair<T, KV>(in[i] >> 16);
  }
}

// What a CTA works on: its sequence, its rows and the tokens of its split.
struct MlaWork {
  int b, split, row0;
  SeqQueries sq;
  int len;        // the context, clamped to the table row's capacity
  int n_rows;     // the sequence's rows: query tokens x heads
  int tok_begin;  // the split's tokens that some row of the CTA attends: [tok_begin, tok_end)
  int tok_end;
};

__device__ inline MlaWork mla_work(const MlaParams& p) {
  MlaWork w;
  int idx = static_cast<int>(blockIdx.x);
  const int rc = idx % p.row_chunks;
  idx /= p.row_chunks;
  w.split = idx % p.splits;
  w.b = idx / p.splits;
  w.row0 = rc * p.cta_rows;
  w.sq = seq_queries(p.q_indptr, p.q_rows, p.max_q, w.b);
  const int capacity = p.max_blocks * p.block_size;
  w.len = min(max(__ldg(p.lens + w.b), 0), capacity);
  w.n_rows = w.sq.n * p.heads;
  // The CTA's last row's query token sees the most keys: up to its own position.
  const int last_tok = min((w.row0 + p.cta_rows - 1) / p.heads, w.sq.n - 1);
  const int keys = min(w.len, w.len - w.sq.n + last_tok + 1);
  w.tok_begin = w.split * p.chunk;
  w.tok_end = min(w.tok_begin + p.chunk, keys);
  return w;
}

// Where key `key` of the tile from key0 lives: its c and k_pe rows, and id < 0 for keys past
// tok_end or block ids outside the pool, which are read as zeros.
template <typename KV>
struct KeyRow {
  const KV* c;
  const KV* kpe;
  int id;
};
template <typename KV>
__device__ inline KeyRow<KV> key_row(const MlaParams& p, const MlaWork& w, int t) {
  int id = -1, slot = 0;
  if (t < w.tok_end) {
    const int blk = t / p.block_size;
    slot = t - blk * p.block_size;
    id = __ldg(p.table + static_cast<long long>(w.b) * p.table_stride + blk);
    if (id >= p.num_blocks) id = -1;
  }
  const long long at = id < 0 ? 0 : id;
  return {static_cast<const KV*>(p.c) + at * p.c_block + slot * p.c_token,
          static_cast<const KV*>(p.kpe) + at * p.kpe_block + slot * p.kpe_token, id};
}

// The byte offset of stage `stage`'s rows and the bytes between them: 16-bit caches land in the
// padded tile itself, 8-bit caches in a raw stage of unpadded rows.
template <typename KV>
__device__ inline int stage_base(const SmemLayout& L, int stage) {
  return sizeof(KV) == 1 ? (stage ? L.raw1 : L.raw0) : (stage ? L.tile1 : L.tile0);
}
template <typename KV>
__device__ inline int stage_row_bytes(const MlaParams& p, const SmemLayout& L) {
  return sizeof(KV) == 1 ? p.rank + p.rope : L.ld * 2;
}

#if __CUDA_ARCH__ >= 900
// sm_90: lanes 0 .. 7 of warp w copy keys 8w .. 8w + 7, each its key's row with one bulk copy
// (two where c and k_pe are apart) that completes on the stage's barrier. A bulk copy takes
// uniform operands, so a warp issues its lanes' copies one after another: eight lanes per warp
// spread that over all warps. A key that reads nothing is zeroed by its lane, which the
// barrier's arrival publishes. Every generic write into a stage (these zeros,
// guard_nonfinite's) is followed by a proxy fence of the writing thread, so that a later tile's
// bulk copies into the same bytes land after it. Waited on with wait_tile.
template <typename KV>
__device__ inline void issue_tile(const MlaParams& p, const SmemLayout& L, char* smem,
                                  const MlaWork& w, int key0, int stage) {
  constexpr int kLanes = kTileKeys / kWarps;
  const int lane = threadIdx.x % 32;
  if (lane >= kLanes) return;
  const int key = (threadIdx.x / 32) * kLanes + lane;
  std::uint64_t* bar = reinterpret_cast<std::uint64_t*>(smem + L.full) + stage;
  const KeyRow<KV> r = key_row<KV>(p, w, key0 + key);
  const int c_bytes = p.rank * static_cast<int>(sizeof(KV));
  const int kpe_bytes = p.rope * static_cast<int>(sizeof(KV));
  char* dst = smem + stage_base<KV>(L, stage) + key * stage_row_bytes<KV>(p, L);
  if (r.id < 0) {
    for (int b = 0; b < c_bytes + kpe_bytes; b += 16) {
      *reinterpret_cast<uint4*>(dst + b) = make_uint4(0, 0, 0, 0);
    }
    sm90::fence_proxy_async();
    sm90::mbar_arrive(bar);
    return;
  }
  sm90::mbar_arrive_expect_tx(bar, c_bytes + kpe_bytes);
  if (r.kpe == r.c + p.rank) {  // one combined row
    sm90::bulk_copy(dst, r.c, c_bytes + kpe_bytes, bar);
    return;
  }
  sm90::bulk_copy(dst, r.c, c_bytes, bar);
  if (kpe_bytes > 0) sm90::bulk_copy(dst + c_bytes, r.kpe, kpe_bytes, bar);
}
__device__ inline void wait_tile(const SmemLayout& L, char* smem, int it, bool /*next_issued*/) {
  sm90::mbar_wait(reinterpret_cast<std::uint64_t*>(smem + L.full) + (it & 1), (it >> 1) & 1);
}
__device__ inline void init_tile_barriers(const SmemLayout& L, char* smem) {
  if (threadIdx.x == 0) {
    sm90::mbar_init(reinterpret_cast<std::uint64_t*>(smem + L.full), kTileKeys);
    sm90::mbar_init(reinterpret_cast<std::uint64_t*>(smem + L.full) + 1, kTileKeys);
    sm90::fence_barrier_init();
  }
}
#else
// Before sm_90: every warp copies keys warp, warp + 8, ..., a row by the whole warp in
// consecutive 16-byte cp.async chunks, one group per tile. Keys that read nothing land as zeros.
template <typename KV>
__device__ inline void issue_tile(const MlaParams& p, const SmemLayout& L, char* smem,
                                  const MlaWork& w, int key0, int stage) {
  constexpr int per = 16 / static_cast<int>(sizeof(KV));  // elements per 16-byte chunk
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rank_chunks = p.rank / per, chunks = (p.rank + p.rope) / per;
  for (int key = warp; key < kTileKeys; key += kWarps) {
    const KeyRow<KV> r = key_row<KV>(p, w, key0 + key);
    char* dst = smem + stage_base<KV>(L, stage) + key * stage_row_bytes<KV>(p, L);
    for (int ch = lane; ch < chunks; ch += 32) {
      const KV* src = ch < rank_chunks ? r.c + ch * per : r.kpe + (ch - rank_chunks) * per;
      cp_async16_row(dst + ch * 16, src, r.id);
    }
  }
  cp_async_commit();
}
// Waits for this thread's copies of tile `it`, the group before the next tile's if issued.
__device__ inline void wait_tile(const SmemLayout&, char*, int, bool next_issued) {
  if (next_issued) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}
__device__ inline void init_tile_barriers(const SmemLayout&, char*) {}
#endif

// 8-bit caches: widens the raw stage into the 16-bit tile; after the barrier that follows the
// copies' wait, so every thread's copies have landed.
template <typename T, typename KV>
__device__ inline void widen_tile(const MlaParams& p, const SmemLayout& L, char* smem, int stage) {
  const int width = p.rank + p.rope;
  const int key = threadIdx.x % kTileKeys;
  const char* raw = smem + (stage ? L.raw1 : L.raw0) + key * width;
  char* out = smem + L.tile0 + key * L.ld * 2;
  for (int ch = threadIdx.x / kTileKeys; ch < width / 16; ch += kThreads / kTileKeys) {
    std::uint32_t wide[8];
    widen_codes<T, KV>(*reinterpret_cast<const uint4*>(raw + ch * 16), wide);
    uint4* dst = reinterpret_cast<uint4*>(out + ch * 32);
    dst[0] = make_uint4(wide[0], wide[1], wide[2], wide[3]);
    dst[1] = make_uint4(wide[4], wide[5], wide[6], wide[7]);
  }
}

// Keys that some rows attend and others do not (a later query token's, with several query
// tokens) may hold non-finite values that must not reach the rows that drop them as 0 x NaN
// through P c: such keys' values are zeroed in the tile and the key flagged, and the rows that
// do attend a flagged key get a NaN logit (its value is not finite there either). Writes
// bad_keys[key] (0 or 1) for every key of the tile at byte offset `tile`.
template <typename T>
__device__ inline void guard_nonfinite(const MlaParams& p, const SmemLayout& L, char* smem,
                                       int tile, int key0, int first_disagree) {
  constexpr std::uint32_t kExp = std::is_same_v<T, __half> ? 0x7c00u : 0x7f80u;
  const int width = p.rank + p.rope;
  int* bad = reinterpret_cast<int*>(smem + L.bad_keys);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int key = warp; key < kTileKeys; key += kWarps) {
    bool any = false;
    if (key0 + key >= first_disagree) {
      std::uint16_t* row = reinterpret_cast<std::uint16_t*>(smem + tile + key * L.ld * 2);
      for (int d = lane; d < width; d += 32) {
        if ((row[d] & kExp) == kExp) {
          row[d] = 0;
          any = true;
        }
      }
    }
    any = __any_sync(0xffffffffu, any);
    if (lane == 0) bad[key] = any ? 1 : 0;
  }
#if __CUDA_ARCH__ >= 900
  sm90::fence_proxy_async();  // the zeros land before a later tile's bulk copies (issue_tile)
#endif
}

}  // namespace pagedattn::detail::cuda::mla
