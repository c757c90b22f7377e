// The split-decode kernel: one CTA per work item (sequence, kv head, split[, head chunk]) of the
// core's split plan, planned on the device by every CTA from the context lengths, so a fixed
// grid (sized from shapes only) serves any context lengths: CUDA-graph safe.
//
// Per CTA: a cp.async pipeline streams tiles of TT tokens of K and V (16-byte chunks, page ids
// read per tile, STAGES - 1 tiles ahead) into shared memory; the compute folds each tile into
// the online-softmax state of the group's query heads (tensor-core MMA for f16/bf16 at group >= 4,
// CUDA cores otherwise); the warps' states merge in a fixed order and the CTA writes one partial
// state (m in log2 units, l, acc) per query head. Deterministic: no atomics, fixed orders.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/split_plan.hpp"

namespace pagedattn::detail::cuda {

constexpr int kThreads = 128;  // every split CTA: 4 warps
constexpr int kWarps = kThreads / 32;

struct SplitParams {
  const void* q;
  int q_dtype;  // DType as int
  const void* k;
  const void* v;
  const std::int32_t* table;
  const std::int32_t* lens;
  int batch, num_heads, num_kv_heads, group, block_size, num_blocks, max_blocks, table_stride;
  float scale_log2;  // scale * log2(e): scores are kept in log2 units
  PlanOptions plan;
  int head_chunks;    // CTAs per item along the group (CUDA-core path with group > 16)
  float* part_ml;     // [partials][2]: m (log2 units), l
  float* part_acc;    // [partials][head_dim]
  int* split_offset;  // [batch + 1], written by CTA 0 for the combine
};

// ---------------------------------------------------------------------------------------------
// Small device helpers.

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float load_q(const void* q, int dtype, std::int64_t i) {
  if (dtype == 0) return static_cast<const float*>(q)[i];
  if (dtype == 1) return __half2float(static_cast<const __half*>(q)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(q)[i]);
}

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; ok == false reads nothing and zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ int clamp_len(int len, int cap) {
  return len < 0 ? 0 : (len > cap ? cap : len);
}

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Device planning: every CTA derives the core's chunk rule from the context lengths, then finds
// which (sequence, split) its global split index j belongs to. CTA 0 also publishes the split
// offsets for the combine.

struct ItemInfo {
  int seq, split, chunk, offset, found;
};

__device__ inline void plan_item(const SplitParams& p, int j, ItemInfo* item) {
  __shared__ long long red_l[kWarps];
  __shared__ int red_i[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cap = p.max_blocks * p.block_size;  // validated to fit int32
  long long sum = 0;
  int mx = 0;
  for (int b = tid; b < p.batch; b += kThreads) {
    const int nb = blocks_for(clamp_len(__ldg(p.lens + b), cap), p.block_size);
    sum += nb;
    mx = max(mx, nb);
  }
  sum = warp_sum(sum);
  mx = warp_max(mx);
  if (lane == 0) {
    red_l[warp] = sum;
    red_i[warp] = mx;
  }
  __syncthreads();
  if (tid == 0) {
    long long s = 0;
    int m = 0;
    for (int w = 0; w < kWarps; ++w) {
      s += red_l[w];
      m = max(m, red_i[w]);
    }
    item->chunk = choose_chunk_blocks(s, m, p.batch, p.num_kv_heads, p.block_size, p.plan);
    item->found = 0;
  }
  __syncthreads();
  const int chunk = item->chunk;
  int running = 0;
  for (int base = 0; base < p.batch; base += kThreads) {
    const int b = base + tid;
    int ns = 0;
    if (b < p.batch) {
      ns = splits_for(blocks_for(clamp_len(__ldg(p.lens + b), cap), p.block_size), chunk);
    }
    int incl = ns;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) red_i[warp] = incl;
    __syncthreads();
    int before = running, total = running;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += red_i[w];
      total += red_i[w];
    }
    incl += before;
    const int excl = incl - ns;
    if (b < p.batch) {
      if (blockIdx.x == 0) p.split_offset[b] = excl;
      if (j >= excl && j < incl) {
        item->seq = b;
        item->split = j - excl;
        item->offset = excl;
        item->found = 1;
      }
    }
    running = total;
    __syncthreads();
  }
  if (blockIdx.x == 0 && tid == 0) p.split_offset[p.batch] = running;
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// Tile loading: TT token rows of K and V, each row D elements in CH 16-byte chunks.
//
// Rows of whole 128-byte segments (D * sizeof(T) a multiple of 128: head dims 64, 128, 192, 256
// in 16-bit types, 64, 96, 128, 192, 256 in f32) are stored swizzled: chunk c of row r sits at
// chunk c ^ (r & 7). Each global 128-byte line then lands in one aligned 128-byte shared segment
// (tiles start 128-byte aligned, see align_smem), which the copy unit serves with one L2 request,
// and chunk c of 8 consecutive rows falls in 8 different bank groups, so ldmatrix and row reads
// are free of bank conflicts. Rows padded by one chunk (the earlier layout) avoided the bank
// conflicts too, but every row then straddled shared 128-byte boundaries and the copy unit split
// its lines: on the H200, Nsight Compute counted 1.5x the necessary L2 sectors (100.7M sectors
// for 67.1M read from DRAM on 128 x 4096, a 34% L2 hit rate, the L2 at 92% of its throughput)
// and the kernel reached 83% of the read ceiling against 91% swizzled. Rows of other sizes (head
// dims 80, 96, 112 in 16-bit types, 80 and 112 in f32) keep one chunk of padding.
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
  return t < tok_end ? __ldg(row_table + t / p.block_size) : -1;
}

// Byte offset of token t's row from the kv head's base, or -1 when it must not be read (past the
// split, or a block id outside the pool: unchecked mode skips such tokens).
template <typename T, int D>
__device__ __forceinline__ long long row_offset(const SplitParams& p, int id, int t, int tok_end) {
  if (t >= tok_end || id < 0 || id >= p.num_blocks) return -1;
  return (static_cast<long long>(id) * p.num_kv_heads * p.block_size + t % p.block_size) *
         (D * static_cast<long long>(sizeof(T)));
}

// Issues the cp.async copies of one tile; rows with offset -1 are zero-filled and flagged invalid.
// When the CTA's threads cover whole rows (CH divides kThreads), each thread keeps one chunk
// column and walks rows at a fixed stride: the addresses are a few adds per copy instead of a
// division per copy, which matters because every thread issues these for every tile.
template <typename T, int D, int TT>
__device__ __forceinline__ void issue_tile(char* sK, char* sV, unsigned char* sValid,
                                           const long long* s_off, const char* gK, const char* gV) {
  constexpr int CH = RowGeom<T, D>::kChunks;
  auto copy = [&](int r, int c) {
    const long long off = s_off[r];
    const bool ok = off >= 0;
    const long long src = (ok ? off : 0) + c * 16;
    const int dst = RowGeom<T, D>::offset(r, c);
    cp_async16(sK + dst, gK + src, ok);
    cp_async16(sV + dst, gV + src, ok);
    if (c == 0) sValid[r] = ok ? 1 : 0;
  };
  if constexpr (CH % 8 == 0 && TT % (kThreads / 8) == 0) {
    // Eight lanes per 128-byte segment of a row, a warp on four rows of one segment: each
    // warp-wide copy is four whole global lines landing in four whole shared segments.
    constexpr int RP = kThreads / 8;  // rows per pass
    const int c0 = threadIdx.x % 8, r0 = threadIdx.x / 8;
#pragma unroll
    for (int seg = 0; seg < CH / 8; ++seg) {
#pragma unroll
      for (int k = 0; k < TT / RP; ++k) copy(r0 + k * RP, c0 + 8 * seg);
    }
  } else if constexpr (kThreads % CH == 0) {
    constexpr int RP = kThreads / CH;  // rows per pass
    const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
#pragma unroll
    for (int k = 0; k < (TT + RP - 1) / RP; ++k) {
      const int r = r0 + k * RP;
      if (TT % RP == 0 || r < TT) copy(r, c);
    }
  } else {
    for (int idx = threadIdx.x; idx < TT * CH; idx += kThreads) {
      const int r = idx / CH;
      copy(r, idx - r * CH);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA-core compute: each warp holds up to 4 query heads; a half-warp takes one token, each
// lane E = D / 16 consecutive elements. Per token: scores by half-warp reductions, then the
// online-softmax update of each head.

// Lane l16's E elements of row r of a tile (words never straddle a 16-byte chunk, so each is
// found through the tile's chunk layout).
template <typename T, int D, int E>
__device__ __forceinline__ void load_slice(const char* tile, int r, int l16, float (&out)[E]) {
  constexpr int kBytes = E * static_cast<int>(sizeof(T));
  constexpr int kAlign = kBytes % 16 == 0 ? 16 : kBytes % 8 == 0 ? 8 : kBytes % 4 == 0 ? 4 : 2;
  constexpr int kWords = kBytes / kAlign;
  using W = typename std::conditional<
      kAlign == 16, uint4,
      typename std::conditional<
          kAlign == 8, uint2,
          typename std::conditional<kAlign == 4, std::uint32_t, std::uint16_t>::type>::type>::type;
  W w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const int byte = l16 * kBytes + i * kAlign;
    w[i] = *reinterpret_cast<const W*>(tile + RowGeom<T, D>::offset(r, byte / 16) + byte % 16);
  }
  const T* e = reinterpret_cast<const T*>(w);
#pragma unroll
  for (int i = 0; i < E; ++i) out[i] = to_f(e[i]);
}

// Pipeline depth against CTAs per SM, by tile size. A large tile (>= 30 KB: 16-bit D >= 112,
// f32 D >= 112) keeps three stages, two tiles in flight per CTA, two CTAs per SM. A smaller tile
// gets about 52 KB of stages so four CTAs fit on an SM: more warps to overlap each warp's
// dependent compute. Measured on the H200 (docs/cuda.md): the 52 KB budget took MHA (CUDA
// cores, D = 128) from 76% to 86% of the read ceiling and the D = 64 MMA kernel from 49% to
// 64%, while the D = 128 MMA kernel lost 10-15 points with it (two stages, three CTAs).
// The dynamic shared memory follows the kernel's static shared variables, so its base is only
// 16-byte aligned (it sat at byte 80); tiles start at the next 128-byte boundary, kSmemAlign bytes
// being reserved for it. Unaligned, every swizzled row segment straddled a shared 128-byte
// boundary and the copy unit fetched each global line in pieces: 1.95x the necessary L2 sectors
// on the H200, 71% of the read ceiling on 128 x 4096 against 91% aligned.
constexpr int kSmemAlign = 128;
__device__ __forceinline__ char* align_smem(char* p) {
  return p + ((kSmemAlign - (smem_u32(p) & (kSmemAlign - 1))) & (kSmemAlign - 1));
}

constexpr int kDeepStageBudget = 106 * 1024;
constexpr int kWideStageBudget = 52 * 1024;
constexpr int stages_for_tile(int tile_bytes) {
  const int budget = tile_bytes >= 30 * 1024 ? kDeepStageBudget : kWideStageBudget;
  return budget / tile_bytes < 2 ? 2 : (budget / tile_bytes > 4 ? 4 : budget / tile_bytes);
}

constexpr int kSimtHeadsPerWarp = 4;
constexpr int kSimtHeadsPerCta = kSimtHeadsPerWarp * kWarps;  // a head chunk

template <typename T, int D>
struct SimtCfg {
  static constexpr int TT = 32;
  static constexpr int ROW = RowGeom<T, D>::kRowBytes;
  static constexpr int TILE = 2 * TT * ROW;
  static constexpr int STAGES = stages_for_tile(TILE);
  static constexpr int E = D / 16;
  static constexpr int SCRATCH = kWarps * kSimtHeadsPerWarp * (D + 2) * 4;
  static constexpr int STAGE_AREA = STAGES * TILE > SCRATCH ? STAGES* TILE : SCRATCH;
  static constexpr int QBYTES = 0;
  // + per stage: row offsets (8 bytes per row) and valid flags (1 byte per row)
  static constexpr int SMEM = STAGE_AREA + QBYTES + STAGES * TT * 9 + kSmemAlign;
};

// ---------------------------------------------------------------------------------------------
// Tensor-core compute (f16/bf16): S = Q K^T and O += P V with mma.sync m16n8k16, the group's
// query heads as the M rows (padded to 16), 16-token slices as N (scores) and K (P V). P is
// split into hi + lo parts of the storage type, so the P V product keeps f32-level accuracy.

template <typename T>
struct MmaOp;
template <>
struct MmaOp<__nv_bfloat16> {
  static __device__ __forceinline__ std::uint32_t pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ void unpack(std::uint32_t u, float& a, float& b) {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&u);
    a = __low2float(h);
    b = __high2float(h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaOp<__half> {
  static __device__ __forceinline__ std::uint32_t pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ void unpack(std::uint32_t u, float& a, float& b) {
    __half2 h = *reinterpret_cast<__half2*>(&u);
    a = __low2float(h);
    b = __high2float(h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

template <typename T, int D>
struct MmaCfg {
  static constexpr int TT = 64;  // 4 slices of 16 tokens
  static constexpr int ROW = RowGeom<T, D>::kRowBytes;
  static constexpr int TILE = 2 * TT * ROW;
  static constexpr int STAGES = stages_for_tile(TILE);
  // Q fragments live in registers up to D = 128; larger head dims read them from shared memory.
  static constexpr bool kQInSmem = D > 128;
  static constexpr int QROWS = 64;  // up to 4 head tiles of 16
  static constexpr int SCRATCH = (kWarps - 1) * 16 * (D + 2) * 4;
  static constexpr int STAGE_AREA = STAGES * TILE > SCRATCH ? STAGES* TILE : SCRATCH;
  static constexpr int QBYTES = kQInSmem ? QROWS * ROW : 0;
  static constexpr int SMEM = STAGE_AREA + QBYTES + STAGES * TT * 9 + kSmemAlign;
};

// ---------------------------------------------------------------------------------------------
// The kernel.

template <typename T, int D, bool kMma>
__global__ void __launch_bounds__(kThreads) split_kernel(SplitParams p) {
  using Cfg = typename std::conditional<kMma, MmaCfg<T, D>, SimtCfg<T, D>>::type;
  constexpr int TT = Cfg::TT;
  constexpr int ROW = Cfg::ROW;
  constexpr int STAGES = Cfg::STAGES;
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = align_smem(smem_raw);
  char* stage_base = smem;
  long long* off_base = reinterpret_cast<long long*>(smem + Cfg::STAGE_AREA + Cfg::QBYTES);
  unsigned char* valid_base = reinterpret_cast<unsigned char*>(off_base + STAGES * TT);
  __shared__ ItemInfo item;

  // The combine is launched as a programmatic dependent of this grid: once every CTA here has
  // started, its CTAs may take free SM slots and wait (griddepcontrol.wait) for this grid's end.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int i = blockIdx.x;
  const int hc = i % p.head_chunks;
  const int kv = (i / p.head_chunks) % p.num_kv_heads;
  const int j = i / (p.head_chunks * p.num_kv_heads);
  plan_item(p, j, &item);
  if (!item.found) return;  // uniform: past the plan's items
  const int b = item.seq;
  const int cap = p.max_blocks * p.block_size;
  const int len = clamp_len(__ldg(p.lens + b), cap);
  const int nb = blocks_for(len, p.block_size);
  int blk_begin = 0, blk_end = 0;
  split_block_range(nb, item.chunk, item.split, &blk_begin, &blk_end);
  const int tok_begin = blk_begin * p.block_size;
  const int tok_end = min(blk_end * p.block_size, len);
  const int ntiles = (tok_end - tok_begin + TT - 1) / TT;
  const std::int32_t* row_table = p.table + static_cast<std::int64_t>(b) * p.table_stride;
  const std::int64_t head_off = static_cast<std::int64_t>(kv) * p.block_size * D * sizeof(T);
  const char* gK = static_cast<const char*>(p.k) + head_off;
  const char* gV = static_cast<const char*>(p.v) + head_off;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = p.group;
  const int head0 = kv * G;  // first query head of the group
  const std::int64_t part_base = static_cast<std::int64_t>(item.offset + item.split) * p.num_heads;

  auto sK = [&](int st) { return stage_base + st * Cfg::TILE; };
  auto sV = [&](int st) { return stage_base + st * Cfg::TILE + TT * ROW; };
  auto sValid = [&](int st) { return valid_base + st * TT; };
  // Row offsets of tile n live in off_base[n % STAGES]: written (from table entries fetched at the
  // top of the iteration) at the end of iteration n - STAGES, read when tile n is issued.
  auto tok_of = [&](int n) { return tok_begin + n * TT + tid; };
  auto pipeline_prologue = [&]() {
    if (tid < TT) {
      int ids[STAGES];
#pragma unroll
      for (int n = 0; n < STAGES; ++n) ids[n] = fetch_id(p, row_table, tok_of(n), tok_end);
#pragma unroll
      for (int n = 0; n < STAGES; ++n) {
        off_base[n * TT + tid] = row_offset<T, D>(p, ids[n], tok_of(n), tok_end);
      }
    }
    __syncthreads();
    for (int n = 0; n < STAGES - 1; ++n) {
      if (n < ntiles) issue_tile<T, D, TT>(sK(n), sV(n), sValid(n), off_base + n * TT, gK, gV);
      cp_async_commit();
    }
  };
  // Top of iteration `it`: wait for tile it, fetch the table entry of tile it + STAGES, issue
  // tile it + STAGES - 1. Returns the fetched entry for pipeline_end.
  auto pipeline_begin = [&](int it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int id = tid < TT ? fetch_id(p, row_table, tok_of(it + STAGES), tok_end) : -1;
    const int nxt = it + STAGES - 1;
    if (nxt < ntiles) {
      const int st = nxt % STAGES;
      issue_tile<T, D, TT>(sK(st), sV(st), sValid(st), off_base + st * TT, gK, gV);
    }
    cp_async_commit();
    return id;
  };
  auto pipeline_end = [&](int it, int id) {
    if (tid < TT) {
      off_base[(it % STAGES) * TT + tid] = row_offset<T, D>(p, id, tok_of(it + STAGES), tok_end);
    }
  };

  if constexpr (kMma) {
    // ---- tensor-core path ----
    using Op = MmaOp<T>;
    char* sQ = smem + Cfg::STAGE_AREA;
    const int WH = G <= 16 ? 1 : (G <= 32 ? 2 : 4);
    const int WT = kWarps / WH;
    const int wh = warp / WT, wt = warp % WT;
    const int g = lane >> 2, q4 = lane & 3;
    const char* gq = static_cast<const char*>(p.q) +
                     (static_cast<std::int64_t>(b) * p.num_heads + head0) * D * sizeof(T);
    // Q of the group (same dtype as the cache, so exact), rows past the group zero.
    constexpr int kQK = MmaCfg<T, D>::kQInSmem ? 1 : D / 16;
    std::uint32_t qf[kQK][4];
    if constexpr (MmaCfg<T, D>::kQInSmem) {
      constexpr int CH = RowGeom<T, D>::kChunks;
      for (int idx = tid; idx < WH * 16 * CH; idx += kThreads) {
        const int r = idx / CH, c = idx - r * CH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < G) v = *reinterpret_cast<const uint4*>(gq + r * D * sizeof(T) + c * 16);
        *reinterpret_cast<uint4*>(sQ + RowGeom<T, D>::offset(r, c)) = v;
      }
    } else {
      // A fragments straight from global: a0 (row g, k 2q4), a1 (row g+8), a2 (k+8), a3.
#pragma unroll
      for (int kk = 0; kk < kQK; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = wh * 16 + g + (r & 1) * 8;
          const int col = kk * 16 + 2 * q4 + (r >> 1) * 8;
          qf[kk][r] = row < G ? *reinterpret_cast<const std::uint32_t*>(
                                    gq + (static_cast<std::int64_t>(row) * D + col) * sizeof(T))
                              : 0u;
        }
      }
    }
    pipeline_prologue();
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    // ldmatrix lane addressing
    // (row, chunk pair) of each lane's 8x8 matrix row; chunk 2 * step + half for k-step `step`.
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_half = lane >> 4;
    const int k_tok = (lane & 7) + (lane >> 4) * 8, k_half = (lane >> 3) & 1;
    const int v_tok = (lane & 7) + ((lane >> 3) & 1) * 8, v_half = lane >> 4;
    using Geo = RowGeom<T, D>;

    for (int it = 0; it < ntiles; ++it) {
      const int next_id = pipeline_begin(it);
      const int st = it % STAGES;
      const int rows = min(TT, tok_end - (tok_begin + it * TT));
      const char* kS = sK(st);
      const char* vS = sV(st);
      const unsigned char* vf = sValid(st);
      for (int sl = wt; sl * 16 < rows; sl += WT) {
        // S = Q K^T over D / 16 k-steps, into two accumulator sets (even and odd steps) so the
        // dependent MMA chains are half as long; summed after.
        float s[2][4], s_odd[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = s_odd[n][e] = 0.f;
        }
        const int k_r = sl * 16 + k_tok;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          std::uint32_t bk[4];
          ldmatrix_x4(bk, kS + Geo::offset(k_r, 2 * kk + k_half));
          float(&acc)[2][4] = kk % 2 == 0 ? s : s_odd;
          if constexpr (MmaCfg<T, D>::kQInSmem) {
            std::uint32_t a[4];
            ldmatrix_x4(a, sQ + Geo::offset(wh * 16 + a_row, 2 * kk + a_half));
            Op::mma(acc[0], a, bk[0], bk[1]);
            Op::mma(acc[1], a, bk[2], bk[3]);
          } else {
            Op::mma(acc[0], qf[kk], bk[0], bk[1]);
            Op::mma(acc[1], qf[kk], bk[2], bk[3]);
          }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] += s_odd[n][e];
        }
        // Scale, mask, row max (rows g and g + 8; a quad shares a row).
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int tok = sl * 16 + n * 8 + 2 * q4 + (e & 1);
            const float v = vf[tok] ? s[n][e] * p.scale_log2 : -INFINITY;
            s[n][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
          }
        }
        float alpha[2], m_use[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          const float m_new = fmaxf(m_r[r], mx[r]);
          m_use[r] = m_new == -INFINITY ? 0.f : m_new;
          alpha[r] = exp2f(m_r[r] - m_use[r]);
          m_r[r] = m_new;
        }
        float ps[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[n][e] = exp2f(s[n][e] - m_use[e >> 1]);
            ps[e >> 1] += s[n][e];
          }
        }
        l_r[0] = l_r[0] * alpha[0] + ps[0];
        l_r[1] = l_r[1] * alpha[1] + ps[1];
        // Rescale the accumulator only when some row's max grew (alpha is exactly 1 otherwise):
        // after the first tiles of a split the max rarely moves.
        if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
          }
        }
        // P as the A operand: hi and lo parts.
        std::uint32_t ph[4], pl[4];
        {
          const float* src[4] = {&s[0][0], &s[0][2], &s[1][0], &s[1][2]};
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            ph[r] = Op::pack(src[r][0], src[r][1]);
            float h0, h1;
            Op::unpack(ph[r], h0, h1);
            pl[r] = Op::pack(src[r][0] - h0, src[r][1] - h1);
          }
        }
        const int v_r = sl * 16 + v_tok;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          std::uint32_t bv[4];
          ldmatrix_x4_trans(bv, vS + Geo::offset(v_r, 2 * dp + v_half));
          Op::mma(o[2 * dp], ph, bv[0], bv[1]);
          Op::mma(o[2 * dp + 1], ph, bv[2], bv[3]);
          Op::mma(o[2 * dp], pl, bv[0], bv[1]);
          Op::mma(o[2 * dp + 1], pl, bv[2], bv[3]);
        }
      }
      pipeline_end(it, next_id);
    }
    cp_async_wait<0>();
    __syncthreads();  // the stage area becomes the merge scratch
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
      l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
    }
    // Merge the WT token warps of each head tile, in order wt = 0, 1, ...
    float* scratch = reinterpret_cast<float*>(smem);
    constexpr int SROW = D + 2;
    if (wt > 0) {
      float* base = scratch + ((wh * (WT - 1) + wt - 1) * 16) * SROW;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float* row = base + (g + 8 * r) * SROW;
        if (q4 == 0) {
          row[D] = m_r[r];
          row[D + 1] = l_r[r];
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          row[n * 8 + 2 * q4] = o[n][2 * r];
          row[n * 8 + 2 * q4 + 1] = o[n][2 * r + 1];
        }
      }
    }
    __syncthreads();
    if (wt == 0) {
      for (int w = 1; w < WT; ++w) {
        const float* base = scratch + ((wh * (WT - 1) + w - 1) * 16) * SROW;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float* row = base + (g + 8 * r) * SROW;
          const float mo = row[D], lo = row[D + 1];
          const float m_new = fmaxf(m_r[r], mo);
          if (m_new == -INFINITY) continue;
          const float fa = exp2f(m_r[r] - m_new), fb = exp2f(mo - m_new);
          l_r[r] = l_r[r] * fa + lo * fb;
          m_r[r] = m_new;
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            o[n][2 * r] = o[n][2 * r] * fa + row[n * 8 + 2 * q4] * fb;
            o[n][2 * r + 1] = o[n][2 * r + 1] * fa + row[n * 8 + 2 * q4 + 1] * fb;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int hl = wh * 16 + g + 8 * r;
        if (hl >= G) continue;
        const std::int64_t pidx = part_base + head0 + hl;
        if (q4 == 0) {
          p.part_ml[2 * pidx] = m_r[r];
          p.part_ml[2 * pidx + 1] = l_r[r];
        }
        float* dst = p.part_acc + pidx * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8 + 2 * q4) =
              make_float2(o[n][2 * r], o[n][2 * r + 1]);
        }
      }
    }
  } else {
    // ---- CUDA-core path ----
    constexpr int E = D / 16;
    constexpr int HW = kSimtHeadsPerWarp;
    const int hbase = hc * kSimtHeadsPerCta;  // first head of this chunk, within the group
    const int GC = min(kSimtHeadsPerCta, G - hbase);
    const int WH = GC <= HW ? 1 : (GC <= 2 * HW ? 2 : 4);
    const int WT = kWarps / WH;
    const int wh = warp / WT, wt = warp % WT;
    const int half = lane >> 4, l16 = lane & 15;
    const int h_first = hbase + wh * HW;  // first head of this warp, within the group
    const int nh = max(0, min(HW, G - h_first));
    float q[HW][E];
#pragma unroll
    for (int h = 0; h < HW; ++h) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        q[h][e] =
            h < nh ? load_q(p.q, p.q_dtype,
                            (static_cast<std::int64_t>(b) * p.num_heads + head0 + h_first + h) * D +
                                l16 * E + e) *
                         p.scale_log2
                   : 0.f;
      }
    }
    pipeline_prologue();
    float acc[HW][E], m_h[HW], l_h[HW];
#pragma unroll
    for (int h = 0; h < HW; ++h) {
      m_h[h] = -INFINITY;
      l_h[h] = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
    }
    for (int it = 0; it < ntiles; ++it) {
      const int next_id = pipeline_begin(it);
      const int st = it % STAGES;
      const int rows = nh > 0 ? min(TT, tok_end - (tok_begin + it * TT)) : 0;
      const char* kS = sK(st);
      const char* vS = sV(st);
      const unsigned char* vf = sValid(st);
      for (int r0 = wt * 2; r0 < rows; r0 += 2 * WT) {
        const int r = r0 + half;  // r < TT always; rows past `rows` are flagged invalid
        const bool ok = r < rows && vf[r];
        float kr[E];
        load_slice<T, D, E>(kS, r, l16, kr);
        float sc[HW];
#pragma unroll
        for (int h = 0; h < HW; ++h) {
          if (h >= nh) break;  // warp-uniform: a small group leaves a warp's last slots empty
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < E; ++e) d = fmaf(q[h][e], kr[e], d);
#pragma unroll
          for (int o2 = 8; o2 > 0; o2 >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o2);
          sc[h] = ok ? d : -INFINITY;
        }
        if (ok) {  // per half-warp; no shuffles inside
          float vr[E];
          load_slice<T, D, E>(vS, r, l16, vr);
#pragma unroll
          for (int h = 0; h < HW; ++h) {
            if (h >= nh) break;
            const float m_new = fmaxf(m_h[h], sc[h]);
            const float alpha = exp2f(m_h[h] - m_new);
            const float pr = exp2f(sc[h] - m_new);
            l_h[h] = l_h[h] * alpha + pr;
            m_h[h] = m_new;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[h][e] = fmaf(pr, vr[e], acc[h][e] * alpha);
          }
        }
      }
      pipeline_end(it, next_id);
    }
    cp_async_wait<0>();
    // Merge the two half-warps (lanes l and l ^ 16 hold the same elements).
#pragma unroll
    for (int h = 0; h < HW; ++h) {
      const float mo = __shfl_xor_sync(0xffffffffu, m_h[h], 16);
      const float lo = __shfl_xor_sync(0xffffffffu, l_h[h], 16);
      const float m_new = fmaxf(m_h[h], mo);
      const float fa = m_new == -INFINITY ? 0.f : exp2f(m_h[h] - m_new);
      const float fb = m_new == -INFINITY ? 0.f : exp2f(mo - m_new);
      // Only the lower half's result is used below.
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[h][e], 16);
        acc[h][e] = acc[h][e] * fa + ao * fb;
      }
      l_h[h] = l_h[h] * fa + lo * fb;
      m_h[h] = m_new;
    }
    __syncthreads();  // the stage area becomes the merge scratch
    float* scratch = reinterpret_cast<float*>(smem);
    constexpr int SROW = D + 2;
    if (wt > 0 && half == 0) {
#pragma unroll
      for (int h = 0; h < HW; ++h) {
        float* row = scratch + ((wh * (WT - 1) + wt - 1) * HW + h) * SROW;
        if (l16 == 0) {
          row[D] = m_h[h];
          row[D + 1] = l_h[h];
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
          const float mo = row[D], lo = row[D + 1];
          const float m_new = fmaxf(m_h[h], mo);
          if (m_new == -INFINITY) continue;
          const float fa = exp2f(m_h[h] - m_new), fb = exp2f(mo - m_new);
          l_h[h] = l_h[h] * fa + lo * fb;
          m_h[h] = m_new;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[h][e] = acc[h][e] * fa + row[l16 * E + e] * fb;
        }
      }
#pragma unroll
      for (int h = 0; h < HW; ++h) {
        if (h >= nh) break;
        const std::int64_t pidx = part_base + head0 + h_first + h;
        if (l16 == 0) {
          p.part_ml[2 * pidx] = m_h[h];
          p.part_ml[2 * pidx + 1] = l_h[h];
        }
        float* dst = p.part_acc + pidx * D + l16 * E;
#pragma unroll
        for (int e = 0; e < E; ++e) dst[e] = acc[h][e];
      }
    }
  }
}

// Per cache dtype (defined in split_<dtype>.cu): launch the split kernel, or report how many of
// its CTAs fit on one SM (the planner sizes its waves with it). f32 has no tensor-core variant.
void launch_split_f32(const SplitParams& p, int head_dim, int grid, cudaStream_t stream);
void launch_split_f16(const SplitParams& p, int head_dim, bool mma, int grid, cudaStream_t stream);
void launch_split_bf16(const SplitParams& p, int head_dim, bool mma, int grid, cudaStream_t stream);
int split_ctas_per_sm_f32(int head_dim);
int split_ctas_per_sm_f16(int head_dim, bool mma);
int split_ctas_per_sm_bf16(int head_dim, bool mma);

// Once per device and kernel: raise the dynamic shared-memory limit (a per-device attribute)
// and read the kernel's occupancy. Returns CTAs per SM, or 0 when the attribute could not be
// set (the launch then reports the error).
template <typename T, int D, bool kMma>
int prepare_split_typed() {
  using Cfg = typename std::conditional<kMma, MmaCfg<T, D>, SimtCfg<T, D>>::type;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> ctas[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  std::atomic<int>* slot = dev < kMaxDevices ? &ctas[dev] : nullptr;
  if (slot != nullptr) {
    const int known = slot->load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  if (cudaFuncSetAttribute(split_kernel<T, D, kMma>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           Cfg::SMEM) != cudaSuccess) {
    return 0;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, split_kernel<T, D, kMma>, kThreads,
                                                    Cfg::SMEM) != cudaSuccess ||
      n < 1) {
    cudaGetLastError();  // clear it: the estimate falls back to one CTA per SM
    n = 1;
  }
  if (slot != nullptr) slot->store(n, std::memory_order_relaxed);
  return n;
}

template <typename T, int D, bool kMma>
void launch_split_typed(const SplitParams& p, int grid, cudaStream_t stream) {
  using Cfg = typename std::conditional<kMma, MmaCfg<T, D>, SimtCfg<T, D>>::type;
  prepare_split_typed<T, D, kMma>();
  split_kernel<T, D, kMma><<<grid, kThreads, Cfg::SMEM, stream>>>(p);
}

// Calls f(std::integral_constant<int, D>) for the compile-time head_dim D; nothing for a head
// dim validate_shapes rejects.
template <typename F>
void with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 80:
      return f(std::integral_constant<int, 80>{});
    case 96:
      return f(std::integral_constant<int, 96>{});
    case 112:
      return f(std::integral_constant<int, 112>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 192:
      return f(std::integral_constant<int, 192>{});
    case 256:
      return f(std::integral_constant<int, 256>{});
    default:
      return;
  }
}

// The kernels of one cache dtype T. kCanMma instantiates the tensor-core variant too (f16/bf16),
// taken when `mma` is set. Each split_<dtype>.cu instantiates these once, so the dtypes compile
// in parallel.
template <typename T, bool kCanMma>
void launch_split_for_dtype(const SplitParams& p, int head_dim, bool mma, int grid,
                            cudaStream_t stream) {
  with_head_dim(head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    if constexpr (kCanMma) {
      if (mma) return launch_split_typed<T, D, true>(p, grid, stream);
    }
    launch_split_typed<T, D, false>(p, grid, stream);
  });
}

template <typename T, bool kCanMma>
int split_ctas_per_sm_for_dtype(int head_dim, bool mma) {
  int n = 0;
  with_head_dim(head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    if constexpr (kCanMma) {
      if (mma) {
        n = prepare_split_typed<T, D, true>();
        return;
      }
    }
    n = prepare_split_typed<T, D, false>();
  });
  return n;
}

}  // namespace pagedattn::detail::cuda
