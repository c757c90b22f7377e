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
  w.row0 = rc * kRows;
  w.sq = seq_queries(p.q_indptr, p.q_rows, p.max_q, w.b);
  const int capacity = p.max_blocks * p.block_size;
  w.len = min(max(__ldg(p.lens + w.b), 0), capacity);
  w.n_rows = w.sq.n * p.heads;
  // The CTA's last row's query token sees the most keys: up to its own position.
  const int last_tok = min((w.row0 + kRows - 1) / p.heads, w.sq.n - 1);
  const int keys = min(w.len, w.len - w.sq.n + last_tok + 1);
  w.tok_begin = w.split * p.chunk;
  w.tok_end = min(w.tok_begin + p.chunk, keys);
  return w;
}

// Issues the copies of the tile of keys from key0 into stage `stage`: thread t copies key t % 64,
// chunks t / 64, + 4, ... of its row. Keys past tok_end and block ids outside the pool read
// nothing and land as zeros.
template <typename KV>
__device__ inline void issue_tile(const MlaParams& p, const SmemLayout& L, char* smem,
                                  const MlaWork& w, int key0, int stage) {
  constexpr bool k8 = sizeof(KV) == 1;
  constexpr int per = 16 / static_cast<int>(sizeof(KV));  // elements per 16-byte chunk
  const int width = p.rank + p.rope;
  const int key = threadIdx.x % kTileKeys;
  const int t = key0 + key;
  int id = -1, slot = 0;
  if (t < w.tok_end) {
    const int blk = t / p.block_size;
    slot = t - blk * p.block_size;
    id = __ldg(p.table + static_cast<long long>(w.b) * p.table_stride + blk);
    if (id >= p.num_blocks) id = -1;
  }
  const long long at = id < 0 ? 0 : id;
  const KV* c_row = static_cast<const KV*>(p.c) + at * p.c_block + slot * p.c_token;
  const KV* kpe_row = static_cast<const KV*>(p.kpe) + at * p.kpe_block + slot * p.kpe_token;
  const int row_bytes = k8 ? width : L.ld * 2;
  char* dst =
      smem + (k8 ? (stage ? L.raw1 : L.raw0) : (stage ? L.tile1 : L.tile0)) + key * row_bytes;
  const int rank_chunks = p.rank / per, chunks = width / per;
  for (int ch = threadIdx.x / kTileKeys; ch < chunks; ch += kThreads / kTileKeys) {
    const KV* src = ch < rank_chunks ? c_row + ch * per : kpe_row + (ch - rank_chunks) * per;
    cp_async16_row(dst + ch * 16, src, id);
  }
}

// 8-bit caches: widens the raw stage into the 16-bit tile; after the barrier that follows the
// copies' wait, so every thread's copies have landed.
template <typename T, typename KV>
__device__ inline void widen_tile(const MlaParams& p, const SmemLayout& L, char* smem, int stage) {
  const int width = p.rank + p.rope;
  const int key = threadIdx.x % kTileKeys;
  const char* raw = smem + (stage ? L.raw1 : L.raw0) + key * width;
  char* out = smem + L.tile0 + key * L.ld * 2;
  for (int ch = threadIdx.x / kTileKeys; ch < width / 16; ch += kThreads / kTileKeys) {
    const uint4 codes = *reinterpret_cast<const uint4*>(raw + ch * 16);
    const std::uint32_t in[4] = {codes.x, codes.y, codes.z, codes.w};
    std::uint32_t wide[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wide[2 * i] = widen_pair<T, KV>(in[i] & 0xffffu);
      wide[2 * i + 1] = widen_pair<T, KV>(in[i] >> 16);
    }
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
}

}  // namespace pagedattn::detail::cuda::mla
