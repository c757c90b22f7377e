// Hopper (sm_90a) prototype of the many-row paged decode, bf16, head dim 128, block size 16.
//
// One CTA per (sequence, kv head, split) holds all group * q_len query rows of its kv head in
// one wgmma M=64 tile (rows padded with zeros). A producer warp streams the split's K/V pages
// with TMA into a ring of shared-memory stages guarded by mbarriers; one consumer warpgroup
// computes S = Q K^T (both operands in shared memory), the online softmax in registers and
// O += P V (P from registers, V from shared memory read MN-major). Splits are merged by a
// combine kernel. Two CTAs fit on an SM, so one CTA's softmax overlaps the other's MMAs.
//
// Build with bench/sm90_many_rows/build.sh; run build-sm90/sm90_many_rows
// [batch,heads,kv_heads,ctx,q_len]...

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

using bf16 = __nv_bfloat16;

constexpr int kD = 128;        // head dim
constexpr int kPage = 16;      // cache block size (tokens)
constexpr int kTileKeys = 64;  // keys per pipeline stage
constexpr int kTilePages = kTileKeys / kPage;
// Pipeline depth: 3 keeps two CTAs per SM within 228 KB of shared memory; 4 or more fit one.
#ifndef PROTO_STAGES
#define PROTO_STAGES 3
#endif
constexpr int kStages = PROTO_STAGES;
// Study options, each a compile-time switch (build.sh builds the variants side by side):
// STUDY_OVERLAP: K and V get rings of their own and the consumer issues the next tile's
//   S = Q K^T and the previous tile's O += P V before the softmax, which then runs while the
//   tensor cores work (software pipelining inside the one warpgroup).
// STUDY_EVICT_FIRST: the TMA copies carry an L2 evict-first policy (K and V are read once).
// STUDY_BALANCED: one CTA per resident slot, each taking an equal share of all (sequence,
//   kv head) tiles in order; a unit cut between CTAs is merged by the combine kernel.
#ifndef STUDY_OVERLAP
#define STUDY_OVERLAP 0
#endif
#ifndef STUDY_EVICT_FIRST
#define STUDY_EVICT_FIRST 0
#endif
#ifndef STUDY_BALANCED
#define STUDY_BALANCED 0
#endif
constexpr bool kOverlap = STUDY_OVERLAP != 0;
constexpr bool kEvictFirst = STUDY_EVICT_FIRST != 0;
constexpr bool kBalanced = STUDY_BALANCED != 0;
constexpr int kRings = kOverlap ? 2 : 1;  // ring 0: K (and V unless split), ring 1: V
constexpr const char* kVariant =
    kOverlap ? (kBalanced ? (kEvictFirst ? "overlap+balanced+evict-first" : "overlap+balanced")
                          : (kEvictFirst ? "overlap+evict-first" : "overlap"))
             : (kBalanced ? (kEvictFirst ? "serial+balanced+evict-first" : "serial+balanced")
                          : (kEvictFirst ? "serial+evict-first" : "serial"));
constexpr int kRows = 64;                  // one wgmma M tile of query rows
constexpr int kConsumers = 128;            // one consumer warpgroup
constexpr int kThreads = kConsumers + 32;  // plus one producer warp
// Operand tiles are two 64-column halves (128 bytes per row, 128B-swizzled) stacked.
constexpr int kHalfBytes = kTileKeys * 128;
constexpr int kPageTxBytes = 2 * kPage * 64 * 2;  // one operand's two halves, per page

// Every operand tile starts on a 1024-byte boundary: the 128B swizzle pattern repeats every
// 8 rows of 128 bytes and is computed from the shared-memory address.
struct SharedStorage {
  bf16 q[kRows * kD];
  bf16 k[kStages][kTileKeys * kD];
  bf16 v[kStages][kTileKeys * kD];
  uint64_t full[kRings][kStages];   // producer -> consumers: the stage's TMA bytes landed
  uint64_t empty[kRings][kStages];  // consumers -> producer: every warp is done reading it
};
static_assert(offsetof(SharedStorage, k) % 1024 == 0 && offsetof(SharedStorage, v) % 1024 == 0);
static_assert(sizeof(bf16) * kRows * kD % 1024 == 0);

struct Params {
  const bf16* q;     // [batch][q_len][heads][kD]
  bf16* out;         // [batch][q_len][heads][kD]
  float* part_o;     // [splits][batch][kv_heads][kRows][kD], normalized per split
  float* part_lse;   // [splits][batch][kv_heads][kRows], log2 units
  const int* table;  // [batch][max_blocks]
  const int* lens;   // [batch]
  int batch, heads, kv_heads, group, q_len, max_blocks, splits;
  float scale_log2;  // softmax scale * log2(e)
  // The balanced plan (STUDY_BALANCED), made on the host; unit u = b * kv_heads + kv_head and
  // CTA c takes global tiles [c T / C, (c + 1) T / C) of the T tiles of all units in order.
  const int* unit_tile0;  // [units + 1]: first global tile of each unit
  const int* cta_unit0;   // [ctas]: the unit holding each CTA's first tile
  const int* unit_ctas;   // [units][2]: first and last CTA covering each unit
  int ctas, total_tiles;
};

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Query row r holds token r / group of head kv_head * group + r % group; token j sees the
// context positions below len - q_len + 1 + j. Padded rows see the whole context.
__device__ inline int row_limit(int r, int group, int q_len, int len) {
  const int j = r / group;
  return j < q_len ? len - q_len + 1 + j : len;
}

// One unit's tiles [t0, t1) decoded by one CTA: written to out when they are the whole unit,
// else as a partial (normalized O and lse) at index `part` of part_o / part_lse.
struct Segment {
  int b, kv_head, len, t0, t1, part;
  bool whole;
};

// Walks a CTA's segments: one per CTA when splitting by grid, one or more in the balanced plan.
struct SegmentCursor {
  int unit, tile, end;  // next unit, next global tile and the end of this CTA's share
};

__device__ inline SegmentCursor begin_segments(const Params& p) {
  if (!kBalanced) return {0, 0, 1};
  const int c = blockIdx.x;
  return {p.cta_unit0[c], int(int64_t(c) * p.total_tiles / p.ctas),
          int(int64_t(c + 1) * p.total_tiles / p.ctas)};
}

__device__ inline bool next_segment(const Params& p, SegmentCursor& cur, Segment& seg) {
  if (cur.tile >= cur.end) return false;
  if (!kBalanced) {  // grid (splits, kv_heads, batch); split s: tiles [s T / S, (s + 1) T / S)
    const int split = blockIdx.x;
    seg.kv_head = blockIdx.y;
    seg.b = blockIdx.z;
    seg.len = p.lens[seg.b];
    const int tiles = ceil_div(seg.len, kTileKeys);
    seg.t0 = split * tiles / p.splits;
    seg.t1 = (split + 1) * tiles / p.splits;
    seg.whole = p.splits == 1;
    seg.part = (split * p.batch + seg.b) * p.kv_heads + seg.kv_head;
    cur.tile = cur.end;
    return true;
  }
  const int u = cur.unit, first = p.unit_tile0[u], last = p.unit_tile0[u + 1];
  const int t1 = min(cur.end, last);
  seg.b = u / p.kv_heads;
  seg.kv_head = u % p.kv_heads;
  seg.len = p.lens[seg.b];
  seg.t0 = cur.tile - first;
  seg.t1 = t1 - first;
  seg.whole = cur.tile == first && t1 == last;
  // Only a CTA's first and last unit can be cut: two partial slots per CTA.
  seg.part = 2 * blockIdx.x + (u == p.cta_unit0[blockIdx.x] ? 0 : 1);
  cur.tile = t1;
  cur.unit = u + 1;
  return true;
}

// ---------------------------------------------------------------------------------------------
// PTX wrappers: mbarriers, TMA, proxy fences, wgmma.

__device__ inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ inline void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
__device__ inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ inline void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ inline void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row,
                                   uint64_t* bar, uint64_t policy) {
  if (kEvictFirst)
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar)), "l"(policy)
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar))
        : "memory");
}
// An L2 policy that evicts the lines it covers first (used only with STUDY_EVICT_FIRST).
__device__ inline uint64_t evict_first_policy() {
  uint64_t policy = 0;
  if (kEvictFirst)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Generic-proxy shared-memory writes become visible to wgmma and TMA (async proxy).
__device__ inline void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ inline void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ inline void consumer_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ inline void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Waits until at most N of this warp's committed wgmma groups are pending (groups retire in
// commit order).
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ inline void wgmma_wait_all() { wgmma_wait<0>(); }
// Keeps the compiler from touching accumulators across an asynchronous wgmma.
template <int N>
__device__ inline void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Matrix descriptor of a 128B-swizzled operand (layout type 1): 8-row groups are 1024 bytes
// apart; lbo is the distance between 64-column halves for MN-major operands (unused, 16, for
// K-major ones, whose k16 slice lies inside one 128-byte row).
__device__ inline uint64_t sw128_desc(uint32_t addr, uint32_t lbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) |
         (uint64_t(1024 >> 4) << 32) | (1ull << 62);
}

// D[64x64] (+)= A[64x16] B[16x64], A and B K-major in shared memory.
__device__ inline void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64x128] += A[64x16] B[16x128], A from registers, B MN-major (transposed) in shared memory.
__device__ inline void wgmma_rs_n128(float (&d)[64], const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, "
      "1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// ---------------------------------------------------------------------------------------------
// Producer: one warp; lanes fetch block ids 32 pages (8 tiles) at a time, lane 0 issues TMA.

// Block ids of tile t: lane L holds page 4 w + L of the window of 8 tiles starting at tile w.
struct TableWindow {
  const int* table_row;
  int len, block_id;

  __device__ void tile_blocks(int t, int first_tile, int (&blocks)[kTilePages]) {
    const int lane = threadIdx.x % 32, window = (t - first_tile) % 8;
    if (window == 0) {
      const int page = t * kTilePages + lane;
      block_id = page * kPage < len ? table_row[page] : 0;  // entries past the context: unread
    }
#pragma unroll
    for (int p = 0; p < kTilePages; ++p) blocks[p] = __shfl_sync(~0u, block_id, window * 4 + p);
  }
};

// Pages of tile t that hold context (the last tile may have fewer than kTilePages).
__device__ inline int tile_pages(int len, int t) {
  return min(kTilePages, ceil_div(len - t * kTileKeys, kPage));
}

// The n-th use of a stage waits until the consumers released its previous use.
__device__ inline void wait_free(uint64_t* empty, int n) {
  if (n >= kStages) mbar_wait(empty, ((n / kStages) + 1) & 1);
}

// Lane 0 loads `pages` pages of kOps operands (K, V, or K and V) into one stage, both 64-column
// halves of each, and tells the stage's full barrier how many bytes to expect.
template <int kOps>
__device__ void issue_pages(bf16* const (&dst)[kOps], const CUtensorMap* const (&map)[kOps],
                            uint64_t* full, const int (&blocks)[kTilePages], int pages, int kv_head,
                            int kv_heads, uint64_t policy) {
  mbar_arrive_expect_tx(full, kOps * pages * kPageTxBytes);
  for (int p = 0; p < pages; ++p) {
    const int row = (blocks[p] * kv_heads + kv_head) * kPage;  // first row of the page
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int off = h * (kHalfBytes / 2) + p * kPage * 64;  // elements
#pragma unroll
      for (int op = 0; op < kOps; ++op)
        tma_load_2d(dst[op] + off, map[op], h * 64, row, full, policy);
    }
  }
}

// Streams one segment's tiles; n counts the CTA's tiles across segments (stage n % kStages).
// With split rings the order is K of tile n, then V of tile n - 1: the order the consumer
// needs them in.
__device__ void produce(SharedStorage& sm, const CUtensorMap* tmap_k, const CUtensorMap* tmap_v,
                        const Params& p, const Segment& seg, int& n) {
  const int lane = threadIdx.x % 32;
  const uint64_t policy = evict_first_policy();
  TableWindow win{p.table + size_t(seg.b) * p.max_blocks, seg.len, 0};
  int blocks[kTilePages], prev[kTilePages], prev_pages = 0;
  for (int t = seg.t0; t < seg.t1; ++t, ++n) {
    win.tile_blocks(t, seg.t0, blocks);
    const int s = n % kStages, pages = tile_pages(seg.len, t);
    wait_free(&sm.empty[0][s], n);
    if (!kOverlap) {
      if (lane == 0)
        issue_pages<2>({sm.k[s], sm.v[s]}, {tmap_k, tmap_v}, &sm.full[0][s], blocks, pages,
                       seg.kv_head, p.kv_heads, policy);
      continue;
    }
    if (lane == 0)
      issue_pages<1>({sm.k[s]}, {tmap_k}, &sm.full[0][s], blocks, pages, seg.kv_head, p.kv_heads,
                     policy);
    if (t > seg.t0) {
      const int sp = (n - 1) % kStages;
      wait_free(&sm.empty[kRings - 1][sp], n - 1);
      if (lane == 0)
        issue_pages<1>({sm.v[sp]}, {tmap_v}, &sm.full[kRings - 1][sp], prev, prev_pages,
                       seg.kv_head, p.kv_heads, policy);
    }
#pragma unroll
    for (int i = 0; i < kTilePages; ++i) prev[i] = blocks[i];
    prev_pages = pages;
  }
  if (kOverlap && seg.t1 > seg.t0) {  // V of the segment's last tile
    const int sp = (n - 1) % kStages;
    wait_free(&sm.empty[kRings - 1][sp], n - 1);
    if (lane == 0)
      issue_pages<1>({sm.v[sp]}, {tmap_v}, &sm.full[kRings - 1][sp], prev, prev_pages, seg.kv_head,
                     p.kv_heads, policy);
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer warpgroup. Thread (warp w, lane) owns accumulator rows 16w + lane/4 and +8; in
// every n8 column group i it holds columns 8i + 2 (lane % 4) + {0, 1} of both rows.

struct RowState {
  float m[2];  // running max of the scaled logits, log2 units
  float l[2];  // this thread's share of the running sum (quad-reduced at the end)
};

// Q rows go to shared memory in the same swizzled K-major layout TMA gives K; padded rows are
// zeros, so their logits stay finite. The first barrier keeps a previous segment's wgmmas,
// which read Q, ahead of the overwrite.
__device__ void load_q(SharedStorage& sm, const Params& p, const Segment& seg, int rows) {
  consumer_sync();
  uint8_t* base = reinterpret_cast<uint8_t*>(sm.q);
  for (int c = threadIdx.x; c < kRows * 16; c += kConsumers) {
    const int row = c / 16, chunk = c % 16, half = chunk / 8, col16 = chunk % 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < rows) {
      const int j = row / p.group, head = seg.kv_head * p.group + row % p.group;
      const bf16* src = p.q + (size_t(seg.b * p.q_len + j) * p.heads + head) * kD + chunk * 8;
      val = *reinterpret_cast<const uint4*>(src);
    }
    const int byte = half * (kRows * 128) + row * 128 + ((col16 ^ (row % 8)) * 16);
    *reinterpret_cast<uint4*>(base + byte) = val;
  }
  fence_proxy_async();
  consumer_sync();
}

// S[64 x 64 keys] = Q K^T over the head dim: eight k16 steps, 32 bytes apart inside a
// swizzled row, switching to the second half after four. Issued and committed as one group;
// the caller waits.
__device__ void issue_scores(float (&s)[32], uint32_t q, uint32_t k) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
    wgmma_ss_n64(s, sw128_desc(q + off, 16), sw128_desc(k + off, 16), kk > 0);
  }
  wgmma_commit();
}

// Keys at or past a row's limit get -inf (a select, so NaN logits of unused slots vanish).
__device__ void mask_scores(float (&s)[32], int key0, int limit0, int limit1) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + 8 * i + 2 * (lane % 4) + e;
      if (key >= limit0) s[4 * i + e] = -INFINITY;
      if (key >= limit1) s[4 * i + 2 + e] = -INFINITY;
    }
  }
}

// Slots past the context and pages never loaded may hold anything, NaN included. P is zero
// there but 0 * NaN is not, so those V rows are cleared before P V reads them.
__device__ void zero_v_tail(bf16* v, int first_row) {
  first_row = max(first_row, 0);
  uint4* base = reinterpret_cast<uint4*>(v);
  for (int c = threadIdx.x; c < (kTileKeys - first_row) * 16; c += kConsumers) {
    const int row = first_row + c / 16, half = (c % 16) / 8;
    base[(half * kHalfBytes + row * 128) / 16 + c % 8] = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  consumer_sync();
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Online softmax over one tile, first half: the new row max, the factor alpha that rescales
// what came before, and s = exp2(s scale - max) in place, added to the row sums. O is not
// touched, so this may run while a wgmma still accumulates into O.
__device__ void softmax_exp(float (&s)[32], RowState& st, float scale_log2, float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
    const float m_new = fmaxf(st.m[r], mx[r] * scale_log2);
    base[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays empty
    alpha[r] = exp2f(st.m[r] - base[r]);
    st.m[r] = m_new;
    st.l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) s[4 * i + c] = exp2f(fmaf(s[4 * i + c], scale_log2, -base[c / 2]));
    st.l[0] += s[4 * i] + s[4 * i + 1];
    st.l[1] += s[4 * i + 2] + s[4 * i + 3];
  }
}

// Second half: O *= alpha per row, and P as bf16 A fragments. The accumulator pairs of n8
// groups 2kk, 2kk+1 are exactly the m64k16 A fragment of k step kk, so pf[4kk .. 4kk+3] feed
// the P V step directly.
__device__ void rescale_and_pack(float (&o)[64], const float (&alpha)[2], const float (&s)[32],
                                 uint32_t (&pf)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    o[4 * i] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) pf[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
}

// O[64 x 128] += P[64 x 64 keys] V; V is MN-major: 16-key steps are 2048 bytes apart and the
// two 64-column halves kHalfBytes apart. Issued and committed as one group; the caller waits.
__device__ void issue_pv(float (&o)[64], const uint32_t (&pf)[16], uint32_t v) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk)
    wgmma_rs_n128(o, &pf[4 * kk], sw128_desc(v + kk * 16 * 128, kHalfBytes));
  wgmma_commit();
}

// Writes O / l for the real rows: bf16 to out when the segment is its whole unit, else f32 to
// its partial with lse (log2 units; -inf for an empty segment, whose O is 0).
__device__ void store_rows(const float (&o)[64], RowState st, const Params& p, const Segment& seg,
                           int rows) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r];
    l += __shfl_xor_sync(~0u, l, 1);
    l += __shfl_xor_sync(~0u, l, 2);
    const int row = warp * 16 + lane / 4 + 8 * r;
    if (row >= rows) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int j = row / p.group, head = seg.kv_head * p.group + row % p.group;
    const size_t part_row = size_t(seg.part) * kRows + row;
    bf16* out = p.out + (size_t(seg.b * p.q_len + j) * p.heads + head) * kD;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int col = 8 * i + 2 * (lane % 4);
      const float x = o[4 * i + 2 * r] * inv, y = o[4 * i + 2 * r + 1] * inv;
      if (seg.whole)
        *reinterpret_cast<__nv_bfloat162*>(out + col) = __floats2bfloat162_rn(x, y);
      else
        *reinterpret_cast<float2*>(p.part_o + part_row * kD + col) = make_float2(x, y);
    }
    if (!seg.whole && lane % 4 == 0)
      p.part_lse[part_row] = l > 0.f ? st.m[r] + log2f(l) : -INFINITY;
  }
}

// Each warp tells the producer it is done reading a stage.
__device__ inline void release(uint64_t* empty) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) mbar_arrive(empty);
}

// The per-thread facts of a segment the tile loop needs.
struct SegmentRows {
  int rows, limit0, limit1, all_visible;  // keys below all_visible are seen by every row
};

__device__ inline SegmentRows segment_rows(const Params& p, const Segment& seg) {
  const int r0 = (threadIdx.x / 32) * 16 + (threadIdx.x % 32) / 4;
  return {p.group * p.q_len, row_limit(r0, p.group, p.q_len, seg.len),
          row_limit(r0 + 8, p.group, p.q_len, seg.len), seg.len - p.q_len + 1};
}

// One tile after another: S, softmax, P V, each waited for before the next (two CTAs per SM
// overlap one's softmax with the other's MMAs). n counts the CTA's tiles across segments.
__device__ void consume_serial(SharedStorage& sm, const Params& p, const Segment& seg, int& n) {
  const SegmentRows sr = segment_rows(p, seg);
  load_q(sm, p, seg, sr.rows);
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  RowState st{{-INFINITY, -INFINITY}, {0.f, 0.f}};
  for (int t = seg.t0; t < seg.t1; ++t, ++n) {
    const int s = n % kStages, key0 = t * kTileKeys;
    mbar_wait(&sm.full[0][s], (n / kStages) & 1);
    float sc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) sc[i] = 0.f;
    issue_scores(sc, smem_u32(sm.q), smem_u32(sm.k[s]));
    wgmma_wait_all();
    fence_regs(sc);
    if (key0 + kTileKeys > sr.all_visible) mask_scores(sc, key0, sr.limit0, sr.limit1);
    if (key0 + kTileKeys > seg.len) zero_v_tail(sm.v[s], seg.len - key0);
    uint32_t pf[16];
    float alpha[2];
    softmax_exp(sc, st, p.scale_log2, alpha);
    rescale_and_pack(o, alpha, sc, pf);
    issue_pv(o, pf, smem_u32(sm.v[s]));
    wgmma_wait_all();
    fence_regs(o);
    release(&sm.empty[0][s]);
  }
  store_rows(o, st, p, seg, sr.rows);
}

// Scores of tile t (stage s) masked, already waited for.
__device__ inline void finish_scores(float (&sc)[32], const SegmentRows& sr, int t) {
  fence_regs(sc);
  const int key0 = t * kTileKeys;
  if (key0 + kTileKeys > sr.all_visible) mask_scores(sc, key0, sr.limit0, sr.limit1);
}

// V of tile t in stage s, landed and with its rows past the context cleared.
__device__ inline void wait_v(SharedStorage& sm, const Segment& seg, int t, int n) {
  const int s = n % kStages, key0 = t * kTileKeys;
  mbar_wait(&sm.full[kRings - 1][s], (n / kStages) & 1);
  if (key0 + kTileKeys > seg.len) zero_v_tail(sm.v[s], seg.len - key0);
}

// Software-pipelined tiles (split K and V rings): at tile n the warpgroup issues S_n = Q K_n^T,
// then O += P_{n-1} V_{n-1}, waits for S_n alone, and runs the softmax of S_n while P V is
// still on the tensor cores; O is rescaled only once P V is done. K_n is released as soon as
// S_n is, V_{n-1} after its P V.
__device__ void consume_overlap(SharedStorage& sm, const Params& p, const Segment& seg, int& n) {
  const SegmentRows sr = segment_rows(p, seg);
  load_q(sm, p, seg, sr.rows);
  float o[64], sc[32], alpha[2];
  uint32_t pf[16];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  RowState st{{-INFINITY, -INFINITY}, {0.f, 0.f}};
  const uint32_t q = smem_u32(sm.q);
  for (int t = seg.t0; t < seg.t1; ++t, ++n) {
    const int s = n % kStages;
    mbar_wait(&sm.full[0][s], (n / kStages) & 1);
#pragma unroll
    for (int i = 0; i < 32; ++i) sc[i] = 0.f;
    issue_scores(sc, q, smem_u32(sm.k[s]));
    if (t == seg.t0) {  // nothing to accumulate yet
      wgmma_wait<0>();
      release(&sm.empty[0][s]);
      finish_scores(sc, sr, t);
      softmax_exp(sc, st, p.scale_log2, alpha);
      rescale_and_pack(o, alpha, sc, pf);
      continue;
    }
    wait_v(sm, seg, t - 1, n - 1);
    issue_pv(o, pf, smem_u32(sm.v[(n - 1) % kStages]));
    wgmma_wait<1>();  // S_n done; P V may still run
    release(&sm.empty[0][s]);
    finish_scores(sc, sr, t);
    softmax_exp(sc, st, p.scale_log2, alpha);
    wgmma_wait<0>();
    fence_regs(o);
    release(&sm.empty[kRings - 1][(n - 1) % kStages]);
    rescale_and_pack(o, alpha, sc, pf);
  }
  if (seg.t1 > seg.t0) {  // P V of the last tile
    wait_v(sm, seg, seg.t1 - 1, n - 1);
    issue_pv(o, pf, smem_u32(sm.v[(n - 1) % kStages]));
    wgmma_wait<0>();
    fence_regs(o);
    release(&sm.empty[kRings - 1][(n - 1) % kStages]);
  }
  store_rows(o, st, p, seg, sr.rows);
}

// grid (splits, kv_heads, batch), or (ctas) with the balanced plan.
__global__ void __launch_bounds__(kThreads, 2)
    many_rows_kernel(const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v, const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma exists only in sm_90a code
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  SharedStorage& sm = *reinterpret_cast<SharedStorage*>(smem_raw);
  if (threadIdx.x == 0) {
    if (smem_u32(smem_raw) % 1024 != 0) __trap();  // the swizzle needs 1024-byte alignment
    for (int r = 0; r < kRings; ++r) {
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&sm.full[r][s], 1);
        mbar_init(&sm.empty[r][s], kConsumers / 32);
      }
    }
    fence_barrier_init();
  }
  __syncthreads();
  SegmentCursor cur = begin_segments(p);
  Segment seg;
  int n = 0;
  while (next_segment(p, cur, seg)) {
    if (threadIdx.x >= kConsumers)
      produce(sm, &tmap_k, &tmap_v, p, seg, n);
    else if (kOverlap)
      consume_overlap(sm, p, seg, n);
    else
      consume_serial(sm, p, seg, n);
  }
#else
  __trap();  // the portable PTX nvcc also embeds for -arch=sm_90a has no wgmma
#endif
}

// out = sum_i 2^(lse_i - M) O_i / sum_i 2^(lse_i - M) over the partials part(0 .. count - 1)
// of one row; one thread per column.
template <class PartIndex>
__device__ void merge_partials(const Params& p, int b, int kv_head, int row, int count,
                               PartIndex part) {
  const int col = threadIdx.x;
  auto at = [&](int i) { return size_t(part(i)) * kRows + row; };
  float mx = -INFINITY;
  for (int i = 0; i < count; ++i) mx = fmaxf(mx, p.part_lse[at(i)]);
  float num = 0.f, den = 0.f;
  if (mx != -INFINITY) {
    for (int i = 0; i < count; ++i) {
      const float w = exp2f(p.part_lse[at(i)] - mx);
      num += w * p.part_o[at(i) * kD + col];
      den += w;
    }
  }
  const int j = row / p.group, head = kv_head * p.group + row % p.group;
  p.out[(size_t(b * p.q_len + j) * p.heads + head) * kD + col] =
      __float2bfloat16_rn(den > 0.f ? num / den : 0.f);
}

// Split by grid: grid (kRows, kv_heads, batch).
__global__ void combine_kernel(const Params p) {
  const int row = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  if (row >= p.group * p.q_len) return;
  merge_partials(p, b, kv_head, row, p.splits,
                 [&](int s) { return (s * p.batch + b) * p.kv_heads + kv_head; });
}

// Balanced plan: grid (kRows, units); a unit inside one CTA was written whole there.
__global__ void combine_balanced_kernel(const Params p) {
  const int row = blockIdx.x, u = blockIdx.y;
  const int lo = p.unit_ctas[2 * u], hi = p.unit_ctas[2 * u + 1];
  if (row >= p.group * p.q_len || lo == hi) return;
  merge_partials(p, u / p.kv_heads, u % p.kv_heads, row, hi - lo + 1, [&](int i) {
    const int c = lo + i;
    return 2 * c + (p.cta_unit0[c] == u ? 0 : 1);
  });
}

// The read ceiling: stream a buffer once with 16-byte loads, four in flight per thread.
__global__ void read_ceiling_kernel(const uint4* buf, size_t n, unsigned* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(buf + i), b = __ldcs(buf + i + stride);
    const uint4 c = __ldcs(buf + i + 2 * stride), d = __ldcs(buf + i + 3 * stride);
    acc ^= (a.x ^ a.y ^ a.z ^ a.w) ^ (b.x ^ b.y ^ b.z ^ b.w) ^ (c.x ^ c.y ^ c.z ^ c.w) ^
           (d.x ^ d.y ^ d.z ^ d.w);  // every byte used, so the loads stay 16 bytes wide
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(buf + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // never true for the zeroed buffer; keeps the loads
}

// Deterministic inputs: value of element idx of a tensor, the same on host and device.
__host__ __device__ inline float input_value(uint64_t idx, uint32_t salt, float amp) {
  uint64_t x = idx * 0x9E3779B97F4A7C15ull + salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return amp * (float(uint32_t(x >> 40)) * (2.f / 16777216.f) - 1.f);
}

__global__ void fill_kernel(bf16* dst, size_t n, uint32_t salt, float amp) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(input_value(i, salt, amp));
}

// ---------------------------------------------------------------------------------------------
// Host side.

constexpr uint32_t kSaltQ = 11, kSaltK = 22, kSaltV = 33;
constexpr float kAmpQ = 2.f, kAmpKV = 1.f;

float bf16_value(uint64_t idx, uint32_t salt, float amp) {
  return __bfloat162float(__float2bfloat16_rn(input_value(idx, salt, amp)));
}

struct Shape {
  int batch, heads, kv_heads, ctx, q_len;
};

bool parse_shape(const char* text, Shape& s) {
  return std::sscanf(text, "%d,%d,%d,%d,%d", &s.batch, &s.heads, &s.kv_heads, &s.ctx, &s.q_len) ==
             5 &&
         s.batch > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.q_len > 0 &&
         (s.heads / s.kv_heads) * s.q_len <= kRows && s.ctx >= s.q_len;
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The cache viewed as rows of kD elements, row (block * kv_heads + kv_head) * kPage + slot;
// a box is one page's 64-column half, written 128B-swizzled.
CUtensorMap make_cache_map(EncodeTiledFn encode, void* base, uint64_t rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {kD, rows}, strides[1] = {kD * sizeof(bf16)};
  const cuuint32_t box[2] = {64, kPage}, elem_strides[2] = {1, 1};
  const CUresult res =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(res));
    std::exit(2);
  }
  return map;
}

EncodeTiledFn get_encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult qres;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                              cudaEnableDefault, &qres));
  if (qres != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled is not available\n");
    std::exit(2);
  }
  return reinterpret_cast<EncodeTiledFn>(fn);
}

// Inputs of one shape. The pool holds `copies` disjoint sets of the context's pages (each a
// shuffled, fragmented block table) so that timing rotates over at least 1 GiB of K/V.
struct Problem {
  Shape shape;
  int group = 0, max_blocks = 0, copies = 1, splits = 1;
  int64_t pages = 0, num_blocks = 0, kv_bytes = 0;  // kv_bytes: context K+V, counted once
  std::vector<int> lens, tables;                    // tables: [copies][batch][max_blocks]
  bf16 *q = nullptr, *out = nullptr, *k = nullptr, *v = nullptr;
  float *part_o = nullptr, *part_lse = nullptr;
  int *d_tables = nullptr, *d_lens = nullptr;
  CUtensorMap map_k, map_v;
  // The balanced plan (Params has the meaning of each array); cut: some unit spans CTAs.
  int ctas = 0, total_tiles = 0;
  bool cut = false;
  std::vector<int> unit_tile0, cta_unit0, unit_ctas;
  int *d_unit_tile0 = nullptr, *d_cta_unit0 = nullptr, *d_unit_ctas = nullptr;
};

// Lengths sit a little under ctx (partial pages and tiles); sequence 0 is short, so some of
// its splits are empty.
void make_lengths_and_tables(Problem& pr) {
  const Shape& s = pr.shape;
  pr.lens.resize(s.batch);
  for (int b = 0; b < s.batch; ++b) pr.lens[b] = std::max(s.q_len, s.ctx - (b * 7919) % 53);
  if (s.batch > 1) pr.lens[0] = std::min(s.ctx, s.q_len + 37);
  pr.max_blocks = ceil_div(s.ctx, kPage);
  for (int b = 0; b < s.batch; ++b) {
    pr.pages += ceil_div(pr.lens[b], kPage);
    pr.kv_bytes += int64_t(pr.lens[b]) * s.kv_heads * kD * sizeof(bf16) * 2;
  }
  const int64_t copy_bytes = pr.pages * s.kv_heads * kPage * kD * sizeof(bf16) * 2;
  pr.copies =
      int(std::min<int64_t>(64, std::max<int64_t>(1, ((1ll << 30) + copy_bytes - 1) / copy_bytes)));
  pr.num_blocks = pr.pages * pr.copies;
  std::vector<int> perm(pr.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(1234);
  std::shuffle(perm.begin(), perm.end(), rng);
  pr.tables.assign(size_t(pr.copies) * s.batch * pr.max_blocks, -1);
  int64_t next = 0;
  for (int c = 0; c < pr.copies; ++c)
    for (int b = 0; b < s.batch; ++b)
      for (int i = 0; i < ceil_div(pr.lens[b], kPage); ++i)
        pr.tables[(size_t(c) * s.batch + b) * pr.max_blocks + i] = perm[next++];
}

// Cuts the T tiles of all units, in unit order, into `slots` equal shares (one CTA each): the
// CTA of global tile x is the largest c with c T / C <= x.
void make_balanced_plan(Problem& pr, int slots) {
  const Shape& s = pr.shape;
  const int units = s.batch * s.kv_heads;
  pr.unit_tile0.assign(units + 1, 0);
  for (int u = 0; u < units; ++u)
    pr.unit_tile0[u + 1] = pr.unit_tile0[u] + ceil_div(pr.lens[u / s.kv_heads], kTileKeys);
  pr.total_tiles = pr.unit_tile0[units];
  pr.ctas = std::min(slots, pr.total_tiles);
  const int64_t total = pr.total_tiles, ctas = pr.ctas;
  auto cta_of = [&](int64_t x) { return int(((x + 1) * ctas - 1) / total); };
  pr.cta_unit0.assign(pr.ctas, 0);
  for (int c = 0, u = 0; c < pr.ctas; ++c) {
    const int64_t first = int64_t(c) * total / ctas;
    while (pr.unit_tile0[u + 1] <= first) ++u;
    pr.cta_unit0[c] = u;
  }
  pr.unit_ctas.assign(2 * units, 0);
  pr.cut = false;
  for (int u = 0; u < units; ++u) {
    pr.unit_ctas[2 * u] = cta_of(pr.unit_tile0[u]);
    pr.unit_ctas[2 * u + 1] = cta_of(pr.unit_tile0[u + 1] - 1);
    pr.cut = pr.cut || pr.unit_ctas[2 * u] != pr.unit_ctas[2 * u + 1];
  }
}

template <class T>
T* device_alloc(size_t count) {
  T* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, count * sizeof(T)));
  return ptr;
}

void fill(bf16* dst, size_t n, uint32_t salt, float amp) {
  fill_kernel<<<1024, 256>>>(dst, n, salt, amp);
  CHECK_CUDA(cudaGetLastError());
}

int* upload(const std::vector<int>& host) {
  int* dev = device_alloc<int>(std::max<size_t>(1, host.size()));
  CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
  return dev;
}

void setup(Problem& pr, const Shape& s, int slots, EncodeTiledFn encode) {
  pr.shape = s;
  pr.group = s.heads / s.kv_heads;
  make_lengths_and_tables(pr);
  const int units = s.batch * s.kv_heads;
  const int min_tiles = std::max(1, ceil_div(s.ctx, kTileKeys) / 2);
  pr.splits = units >= slots * 3 / 4 ? 1 : std::max(1, std::min(slots / units, min_tiles));
  if (const char* env = std::getenv("SPLITS")) pr.splits = std::max(1, std::atoi(env));
  pr.ctas = pr.splits * units;
  if (kBalanced) {
    make_balanced_plan(pr, slots);
    pr.d_unit_tile0 = upload(pr.unit_tile0);
    pr.d_cta_unit0 = upload(pr.cta_unit0);
    pr.d_unit_ctas = upload(pr.unit_ctas);
  }
  const size_t q_elems = size_t(s.batch) * s.q_len * s.heads * kD;
  const size_t cache_elems = size_t(pr.num_blocks) * s.kv_heads * kPage * kD;
  const size_t part_rows = size_t(kBalanced ? 2 * pr.ctas : pr.ctas) * kRows;
  pr.q = device_alloc<bf16>(q_elems);
  pr.out = device_alloc<bf16>(q_elems);
  pr.k = device_alloc<bf16>(cache_elems);
  pr.v = device_alloc<bf16>(cache_elems);
  pr.part_o = device_alloc<float>(part_rows * kD);
  pr.part_lse = device_alloc<float>(part_rows);
  pr.d_tables = device_alloc<int>(pr.tables.size());
  pr.d_lens = device_alloc<int>(s.batch);
  fill(pr.q, q_elems, kSaltQ, kAmpQ);
  fill(pr.k, cache_elems, kSaltK, kAmpKV);
  fill(pr.v, cache_elems, kSaltV, kAmpKV);
  CHECK_CUDA(cudaMemset(pr.out, 0xff, q_elems * sizeof(bf16)));  // NaN until written
  CHECK_CUDA(cudaMemcpy(pr.d_tables, pr.tables.data(), pr.tables.size() * sizeof(int),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(pr.d_lens, pr.lens.data(), s.batch * sizeof(int), cudaMemcpyHostToDevice));
  const uint64_t rows = uint64_t(pr.num_blocks) * s.kv_heads * kPage;
  pr.map_k = make_cache_map(encode, pr.k, rows);
  pr.map_v = make_cache_map(encode, pr.v, rows);
}

void release(Problem& pr) {
  for (void* ptr : {(void*)pr.q, (void*)pr.out, (void*)pr.k, (void*)pr.v, (void*)pr.part_o,
                    (void*)pr.part_lse, (void*)pr.d_tables, (void*)pr.d_lens,
                    (void*)pr.d_unit_tile0, (void*)pr.d_cta_unit0, (void*)pr.d_unit_ctas})
    CHECK_CUDA(cudaFree(ptr));
}

// One decode call with block-table copy `copy`.
void launch(const Problem& pr, int copy) {
  const Shape& s = pr.shape;
  Params p{pr.q,
           pr.out,
           pr.part_o,
           pr.part_lse,
           pr.d_tables + size_t(copy) * s.batch * pr.max_blocks,
           pr.d_lens,
           s.batch,
           s.heads,
           s.kv_heads,
           pr.group,
           s.q_len,
           pr.max_blocks,
           pr.splits,
           float(1.0 / std::sqrt(double(kD)) * 1.4426950408889634),
           pr.d_unit_tile0,
           pr.d_cta_unit0,
           pr.d_unit_ctas,
           pr.ctas,
           pr.total_tiles};
  if (kBalanced) {
    many_rows_kernel<<<pr.ctas, kThreads, sizeof(SharedStorage)>>>(pr.map_k, pr.map_v, p);
    if (pr.cut) combine_balanced_kernel<<<dim3(kRows, s.batch * s.kv_heads), kD>>>(p);
    return;
  }
  many_rows_kernel<<<dim3(pr.splits, s.kv_heads, s.batch), kThreads, sizeof(SharedStorage)>>>(
      pr.map_k, pr.map_v, p);
  if (pr.splits > 1) combine_kernel<<<dim3(kRows, s.kv_heads, s.batch), kD>>>(p);
}

struct CheckResult {
  double max_err = 0, max_ref = 0;
};

// f64 reference of every output of sequence b (block-table copy 0) against `got`.
void check_sequence(const Problem& pr, int b, const std::vector<bf16>& got, CheckResult& res) {
  const Shape& s = pr.shape;
  const int len = pr.lens[b];
  const double scale = 1.0 / std::sqrt(double(kD));
  double max_err = 0, max_ref = 0;
#pragma omp parallel for reduction(max : max_err, max_ref)
  for (int kv_head = 0; kv_head < s.kv_heads; ++kv_head) {
    std::vector<float> kr(size_t(len) * kD), vr(size_t(len) * kD);
    for (int t = 0; t < len; ++t) {
      const int block = pr.tables[size_t(b) * pr.max_blocks + t / kPage];
      const uint64_t row = (uint64_t(block) * s.kv_heads + kv_head) * kPage + t % kPage;
      for (int d = 0; d < kD; ++d) {
        kr[size_t(t) * kD + d] = bf16_value(row * kD + d, kSaltK, kAmpKV);
        vr[size_t(t) * kD + d] = bf16_value(row * kD + d, kSaltV, kAmpKV);
      }
    }
    std::vector<double> q(kD), w(len), o(kD);
    for (int j = 0; j < s.q_len; ++j) {
      for (int g = 0; g < pr.group; ++g) {
        const size_t qrow = (size_t(b) * s.q_len + j) * s.heads + kv_head * pr.group + g;
        for (int d = 0; d < kD; ++d) q[d] = bf16_value(qrow * kD + d, kSaltQ, kAmpQ);
        const int limit = len - s.q_len + 1 + j;
        double mx = -INFINITY, den = 0;
        for (int t = 0; t < limit; ++t) {
          double dot = 0;
          for (int d = 0; d < kD; ++d) dot += q[d] * kr[size_t(t) * kD + d];
          w[t] = dot * scale;
          mx = std::max(mx, w[t]);
        }
        std::fill(o.begin(), o.end(), 0.0);
        for (int t = 0; t < limit; ++t) {
          const double e = std::exp(w[t] - mx);
          den += e;
          for (int d = 0; d < kD; ++d) o[d] += e * vr[size_t(t) * kD + d];
        }
        for (int d = 0; d < kD; ++d) {
          const double ref = o[d] / den, val = __bfloat162float(got[qrow * kD + d]);
          max_ref = std::max(max_ref, std::abs(ref));
          max_err = std::max(max_err, std::isfinite(val) ? std::abs(val - ref) : INFINITY);
        }
      }
    }
  }
  res.max_err = std::max(res.max_err, max_err);
  res.max_ref = std::max(res.max_ref, max_ref);
}

// Runs one call, requires every output to be finite and the sampled sequences (first, middle,
// last) to match the reference within 2e-2 of the output scale.
bool check(const Problem& pr) {
  const Shape& s = pr.shape;
  CHECK_CUDA(cudaMemset(pr.out, 0xff, size_t(s.batch) * s.q_len * s.heads * kD * sizeof(bf16)));
  launch(pr, 0);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<bf16> got(size_t(s.batch) * s.q_len * s.heads * kD);
  CHECK_CUDA(cudaMemcpy(got.data(), pr.out, got.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (const bf16& x : got) bad += !std::isfinite(__bfloat162float(x));
  CheckResult res;
  for (int b : {0, s.batch / 2, s.batch - 1}) check_sequence(pr, b, got, res);
  const bool ok = bad == 0 && res.max_err <= 2e-2 * res.max_ref;
  std::printf("  check: %s  max abs err %.3e  output scale %.3e  non-finite outputs %zu\n",
              ok ? "PASS" : "FAIL", res.max_err, res.max_ref, bad);
  return ok;
}

// Mean microseconds per call of `call(i)` over `iters` calls after a warm-up.
template <class F>
double time_us(F call, int iters) {
  for (int i = 0; i < 3; ++i) call(i);
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) call(i);
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  CHECK_CUDA(cudaGetLastError());
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return 1e3 * ms / iters;
}

// GB/s of one streaming pass over a 4 GiB buffer.
double read_ceiling_gbs(int sms) {
  const size_t bytes = size_t(4) << 30;
  uint4* buf = device_alloc<uint4>(bytes / sizeof(uint4));
  unsigned* sink = device_alloc<unsigned>(1);
  CHECK_CUDA(cudaMemset(buf, 0, bytes));
  const double us = time_us(
      [&](int) { read_ceiling_kernel<<<sms * 8, 512>>>(buf, bytes / sizeof(uint4), sink); }, 10);
  CHECK_CUDA(cudaFree(buf));
  CHECK_CUDA(cudaFree(sink));
  std::printf("read ceiling: %.1f us per 4 GiB pass, %.0f GB/s\n", us, bytes / us * 1e-3);
  return bytes / us * 1e-3;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    Shape s;
    if (!parse_shape(argv[i], s)) {
      std::fprintf(stderr,
                   "bad shape '%s': want batch,heads,kv_heads,ctx,q_len with heads %% kv_heads "
                   "== 0, (heads / kv_heads) * q_len <= %d, ctx >= q_len\n",
                   argv[i], kRows);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty())
    shapes = {{64, 64, 8, 4096, 8},
              {32, 32, 8, 16384, 8},
              {128, 32, 8, 4096, 8},
              {8, 32, 8, 32768, 16},
              {32, 32, 8, 16384, 1}};
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  CHECK_CUDA(cudaFuncSetAttribute(many_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(sizeof(SharedStorage))));
  CHECK_CUDA(cudaFuncSetAttribute(many_rows_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(cudaSharedmemCarveoutMaxShared)));
  int ctas_per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, many_rows_kernel, kThreads,
                                                           sizeof(SharedStorage)));
  std::printf("%s, %d SMs; kernel (%s): %zu B shared memory, %d CTAs per SM\n", prop.name,
              prop.multiProcessorCount, kVariant, sizeof(SharedStorage), ctas_per_sm);
  const double ceiling = read_ceiling_gbs(prop.multiProcessorCount);
  const EncodeTiledFn encode = get_encode_fn();
  bool all_ok = true;
  for (const Shape& s : shapes) {
    Problem pr;
    setup(pr, s, ctas_per_sm * prop.multiProcessorCount, encode);
    if (kBalanced)
      std::printf(
          "shape %d,%d,%d,%d,%d: %d rows per kv head, balanced, %d CTAs of %d tiles, "
          "%d table copies\n",
          s.batch, s.heads, s.kv_heads, s.ctx, s.q_len, pr.group * s.q_len, pr.ctas,
          ceil_div(pr.total_tiles, pr.ctas), pr.copies);
    else
      std::printf(
          "shape %d,%d,%d,%d,%d: %d rows per kv head, %d splits, %d CTAs, %d table copies\n",
          s.batch, s.heads, s.kv_heads, s.ctx, s.q_len, pr.group * s.q_len, pr.splits, pr.ctas,
          pr.copies);
    const bool ok = check(pr);
    all_ok = all_ok && ok;
    const double us = time_us([&](int i) { launch(pr, i % pr.copies); }, 50);
    const double gbs = pr.kv_bytes / us * 1e-3;
    std::printf("  %.1f us per call, %.0f GB/s of K/V, %.1f%% of the read ceiling\n", us, gbs,
                100.0 * gbs / ceiling);
    release(pr);
  }
  std::printf(all_ok ? "all checks passed\n" : "CHECK FAILED\n");
  return all_ok ? 0 : 1;
}
