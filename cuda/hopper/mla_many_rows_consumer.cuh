// The sm_90 MLA kernel's two consumer warpgroups, one tile at a time. Group g computes the scores
// of the tile's keys 32 g .. 32 g + 31 for all 64 rows (wgmma m64n32k16 over the 576-wide row,
// both operands in shared memory), the groups exchange their row maxima, each writes its weights
// into the shared P, and each accumulates O's columns 256 g .. 256 g + 255 over all 64 keys
// (wgmma m64n256k16, P and the tile's c parts from shared memory). The online softmax is in log2
// units (pagedattn/online_softmax.hpp); both groups see the same maxima, so their halves of O
// and their shares of l always carry the same scale.
//
// Thread (warp w of its group, lane) owns rows 16 w + lane / 4 and that + 8; in every 8-column
// group i of an accumulator it holds columns 8 i + 2 (lane % 4) + {0, 1} of both rows.
#pragma once

#include <climits>
#include <cstdint>

#include "many_rows_consumer.cuh"  // nonfinite_lanes
#include "mla_many_rows_layout.cuh"
#include "pagedattn/online_softmax.hpp"
#include "sm90_ptx.cuh"

namespace pagedattn::detail::cuda::mla::sm90 {

using cuda::sm90::fence_proxy_async;
using cuda::sm90::fence_regs;
using cuda::sm90::sw128_desc;
using cuda::sm90::wgmma_commit;
using cuda::sm90::wgmma_fence;
using cuda::sm90::wgmma_wait;

// Named barriers: 1 joins both groups, 2 + g group g alone (0 is __syncthreads').
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}
__device__ __forceinline__ void group_sync(int g) {
  asm volatile("bar.sync %0, 128;" ::"r"(2 + g) : "memory");
}

// This thread's two rows of the CTA: valid (a query row of the sequence) and the keys it attends,
// [tok_begin, end); padding rows attend every key of the split, so their scores stay harmless.
struct ThreadRows {
  int lr[2];
  bool valid[2];
  int end[2];
};
__device__ inline ThreadRows thread_rows(const MlaParams& p, const MlaWork& w) {
  const int t = threadIdx.x % 128;
  ThreadRows r;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    r.lr[i] = 16 * (t / 32) + (t % 32) / 4 + 8 * i;
    const int row = w.row0 + r.lr[i];
    r.valid[i] = row < w.n_rows;
    r.end[i] = r.valid[i] ? min(w.len - w.sq.n + row / p.heads + 1, w.tok_end) : w.tok_end;
  }
  return r;
}

// Eight 16-bit values of q from src: one 16-byte load where q allows it.
__device__ __forceinline__ uint4 q_piece(const std::uint16_t* src, bool vec16) {
  if (vec16) return __ldg(reinterpret_cast<const uint4*>(src));
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = __ldg(src + 2 * i) | (std::uint32_t{__ldg(src + 2 * i + 1)} << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Q's 64 rows (zeros past the sequence's rows) into shared memory, laid out as a tile.
__device__ inline void load_q(Storage& sm, const MlaParams& p, const MlaWork& w) {
  constexpr int kPieces = kParts * 8;  // 16-byte pieces of a row
  const auto* q_nope = static_cast<const std::uint16_t*>(p.q_nope);
  const auto* q_pe = static_cast<const std::uint16_t*>(p.q_pe);
  for (int c = threadIdx.x; c < kRowsPerCta * kPieces; c += kConsumers) {
    const int lr = c / kPieces, piece = c % kPieces, part = piece / 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    const int r = w.row0 + lr;
    if (r < w.n_rows) {
      const int i = r / p.heads, h = r - i * p.heads;
      const long long row = w.sq.row0 + i;
      const std::uint16_t* src =
          part < kCParts ? q_nope + row * p.q_nope_row + h * p.q_nope_head + piece * 8
                         : q_pe + row * p.q_pe_row + h * p.q_pe_head + (piece - 8 * kCParts) * 8;
      v = q_piece(src, p.q_vec16);
    }
    *reinterpret_cast<uint4*>(sm.q + part * kPartBytes + lr * 128 + ((piece % 8) ^ (lr % 8)) * 16) =
        v;
  }
  fence_proxy_async();
  consumers_sync();
}

// Group g's scores S[64 rows x 32 keys] = Q K^T: four k16 steps per part, 32 bytes apart inside a
// swizzled row. k: the tile's address plus the group's first key row. The caller waits.
template <typename T>
__device__ __forceinline__ void issue_scores(float (&s)[16], std::uint32_t q, std::uint32_t k) {
  wgmma_fence();
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const std::uint32_t off = part * kPartBytes + kk * 32;
      cuda::sm90::wgmma_ss_n32<T>(s, sw128_desc(q + off, 16), sw128_desc(k + off, 16),
                                  part + kk > 0);
    }
  }
  wgmma_commit();
}

// Group g's O[64 x 256] += P[64 x 64 keys] c[64 keys x its 256 columns]: c MN-major, 16-key steps
// 2048 bytes apart, its four 64-column parts kPartBytes apart. The caller waits.
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[128], std::uint32_t p, std::uint32_t c) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    cuda::sm90::wgmma_ss_n256<T>(o, sw128_desc(p + kk * 32, 16),
                                 sw128_desc(c + kk * 16 * 128, kPartBytes));
  }
  wgmma_commit();
}

// On an edge tile, before its scores: group g's keys that no row may weigh (past the split's
// tokens, or on a page not copied, whose bytes are stale) get zeros in c, as P c would turn their
// NaN into 0 x NaN; keys that some rows attend and others do not (a later query token's) get
// their non-finite values zeroed and a bit in bad_keys[g], so that the rows that attend them get
// a NaN logit (their values are not finite there either) and the others nothing.
template <typename T>
__device__ void sanitize_keys(Storage& sm, char* tile, int key0, const MlaWork& w, std::uint32_t ok,
                              int page_rows, int first_disagree, int g) {
  const int t = threadIdx.x % 128, lane = t % 32;
  const int k = g * kGroupKeys + t / 4;  // four threads per key
  const int key = key0 + k;
  const bool dead = key >= w.tok_end || !((ok >> (k / page_rows)) & 1u);
  const bool check = !dead && key >= first_disagree;
  bool bad = false;
  if (dead || check) {
    for (int piece = t % 4; piece < kParts * 8; piece += 4) {
      const int part = piece / 8;
      if (dead && part >= kCParts) break;  // a dead key's k_pe is masked in S
      uint4* at = reinterpret_cast<uint4*>(tile + part * kPartBytes + k * 128 + (piece % 8) * 16);
      if (dead) {
        *at = make_uint4(0, 0, 0, 0);
        continue;
      }
      const unsigned lanes = cuda::sm90::nonfinite_lanes<T>(*at);
      if (lanes == 0) continue;
      bad = true;
      std::uint32_t v[4] = {at->x, at->y, at->z, at->w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if ((lanes >> (2 * i)) & 1u) v[i] &= 0xffff0000u;
        if ((lanes >> (2 * i + 1)) & 1u) v[i] &= 0x0000ffffu;
      }
      *at = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  const unsigned ballot = __ballot_sync(0xffffffffu, bad);
  if (lane == 0) {
    unsigned byte = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) byte |= ((ballot >> (4 * j)) & 0xfu) != 0 ? 1u << j : 0u;
    reinterpret_cast<unsigned char*>(&sm.bad_keys[g])[t / 32] = static_cast<unsigned char>(byte);
  }
  fence_proxy_async();
  group_sync(g);
}

// The mask of an edge tile: -inf for keys past a row's end or on a page not copied (a select:
// their scores may be NaN), NaN for a flagged key of a row that attends it.
__device__ inline void mask_scores(float (&s)[16], int key0, const ThreadRows& rows,
                                   std::uint32_t ok, int page_rows, std::uint32_t bad, int g) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int kg = 8 * i + 2 * (lane % 4) + e, k = g * kGroupKeys + kg, key = key0 + k;
      const bool copied = (ok >> (k / page_rows)) & 1u;
      const bool flagged = (bad >> kg) & 1u;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float& x = s[4 * i + 2 * r + e];
        x = !copied || key >= rows.end[r] ? -INFINITY : (flagged ? NAN : x);
      }
    }
  }
}

// The tile's online softmax: each row's max over both groups' keys raises the state (alpha: the
// factor for what O holds), and s becomes this group's weights exp2(s scale - max), added to the
// thread's share of l.
__device__ inline void softmax_tile(Storage& sm, float (&s)[16], SoftmaxState2 (&st)[2],
                                    const ThreadRows& rows, float scale_log2, int g,
                                    float (&alpha)[2]) {
  const int lane = threadIdx.x % 32;
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) mx[r] = fmaxf(mx[r], fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    if (lane % 4 == 0) sm.row_max[g][rows.lr[r]] = mx[r];
  }
  consumers_sync();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float tile_max = fmaxf(mx[r], sm.row_max[g ^ 1][rows.lr[r]]);
    alpha[r] = st[r].rescale_to(tile_max * scale_log2);
    const float shift = st[r].shift();
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * i + 2 * r + e];
        x = Log2Exp::exp(fmaf(x, scale_log2, -shift));
        sum += x;
      }
    }
    st[r].add(sum);
  }
}

// This group's weights into P (keys 32 g ..), in q's 16-bit type; then both groups wait for the
// whole of P.
template <typename T>
__device__ inline void store_p(Storage& sm, const float (&s)[16], const ThreadRows& rows, int g) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int lr = rows.lr[r];
    char* row = sm.p + lr * 128 + 4 * (lane % 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int chunk = g * (kGroupKeys / 8) + i;
      *reinterpret_cast<std::uint32_t*>(row + ((chunk ^ (lr % 8)) * 16)) =
          cuda::sm90::WgmmaType<T>::pack(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]);
    }
  }
  fence_proxy_async();
  consumers_sync();
}

__device__ __forceinline__ void rescale(float (&o)[128], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
}

// Every consumer warp tells the producer it is done with a stage.
__device__ __forceinline__ void release(std::uint64_t* empty) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) cuda::sm90::mbar_arrive(empty);
}

// The CTA's partial state in the combine's layout: (m, l) from the first group (l summed over
// both groups' keys), O's columns from each group.
__device__ inline void store_partial(Storage& sm, const MlaParams& p, const MlaWork& w,
                                     const ThreadRows& rows, const float (&o)[128],
                                     const SoftmaxState2 (&st)[2], int g) {
  const int lane = threadIdx.x % 32;
  float l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = st[r].l;
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (g == 1 && lane % 4 == 0) sm.row_sum[rows.lr[r]] = l[r];
  }
  consumers_sync();
  const long long rows_per_split = static_cast<long long>(p.max_q) * p.heads;
  const long long part =
      (static_cast<long long>(w.b) * p.splits + w.split) * rows_per_split + w.row0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!rows.valid[r]) continue;
    const int lr = rows.lr[r];
    if (g == 0 && lane % 4 == 0) {
      const float total = l[r] + sm.row_sum[lr];
      // A NaN that reached l makes m NaN too: the combine then keeps it whatever the other splits.
      const float m = total != total ? NAN : st[r].m;
      *reinterpret_cast<float2*>(p.part_ml + 2 * (part + lr)) = make_float2(m, total);
    }
    float* dst = p.part_acc + (part + lr) * p.rank + g * kGroupCols + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      *reinterpret_cast<float2*>(dst + 8 * i) =
          make_float2(o[4 * i + 2 * r] * p.out_scale, o[4 * i + 2 * r + 1] * p.out_scale);
    }
  }
}

// 8-bit caches: the raw stage's codes widened, exactly, into the 16-bit tile (which both groups
// have finished reading: the caller's barrier), then the raw stage goes back to the producer.
template <typename T, typename KV>
__device__ void widen_stage(Storage& sm, int s) {
  constexpr int kRowChunks = (kRank + kRope) / 16;  // 16 codes each
  const char* raw = raw_stage(sm, s);
  for (int c = threadIdx.x; c < kKeys * kRowChunks; c += kConsumers) {
    const int k = c / kRowChunks, col = (c % kRowChunks) * 16;
    const char* src = col < kRank ? raw + (col / kRawBoxCols) * kKeys * kRawBoxCols +
                                        k * kRawBoxCols + col % kRawBoxCols
                                  : raw + kRank * kKeys + k * kRope + (col - kRank);
    std::uint32_t wide[8];
    widen_codes<T, KV>(*reinterpret_cast<const uint4*>(src), wide);
    const int piece = (col % 64) / 8;
    char* row = sm.kv[0] + (col / 64) * kPartBytes + k * 128;
    *reinterpret_cast<uint4*>(row + ((piece ^ (k % 8)) * 16)) =
        make_uint4(wide[0], wide[1], wide[2], wide[3]);
    *reinterpret_cast<uint4*>(row + (((piece + 1) ^ (k % 8)) * 16)) =
        make_uint4(wide[4], wide[5], wide[6], wide[7]);
  }
  fence_proxy_async();
  consumers_sync();
  release(&sm.empty[s]);
}

// What the consumers know of tile t once it is open: its stage, keys, copied pages, and whether
// it needs the mask (and which of its keys are flagged).
struct OpenTile {
  int s, key0;
  std::uint32_t ok, bad;
  bool edge;
};

// The facts of the CTA's split that every tile reads.
struct SplitFacts {
  int first_disagree;  // keys from here on are attended by some query tokens only
  int all_end;         // keys below are attended by every row of the CTA
  std::uint32_t all_pages;
  Pages pages;
};
__device__ inline SplitFacts split_facts(const MlaParams& p, const MlaWork& w) {
  SplitFacts f;
  f.first_disagree = w.sq.n > 1 ? w.len - w.sq.n + 1 : INT_MAX;
  f.all_end = min(w.len - w.sq.n + w.row0 / p.heads + 1, w.tok_end);
  f.pages = tile_pages(p.block_size);
  f.all_pages = (1u << f.pages.per_tile) - 1u;
  return f;
}

// Waits for tile t, widens an 8-bit cache's codes (after both groups finished reading the last
// tile) and sanitizes an edge tile's keys of this group: then its scores may be issued.
template <typename T, typename KV>
__device__ inline OpenTile open_tile(Storage& sm, const MlaParams& p, const MlaWork& w,
                                     const SplitFacts& f, int t, int g) {
  OpenTile o;
  o.s = t % kStages;
  o.key0 = w.tok_begin + t * kKeys;
  o.ok = pages_copied(p, w, o.key0);
  o.edge = o.key0 + kKeys > f.all_end || o.ok != f.all_pages;  // uniform
  o.bad = 0;
  cuda::sm90::mbar_wait(&sm.full[o.s], (t / kStages) & 1);
  if constexpr (sizeof(KV) == 1) {
    if (t > 0) consumers_sync();  // both groups' P c of the last tile is done
    widen_stage<T, KV>(sm, o.s);
  }
  if (o.edge) {
    sanitize_keys<T>(sm, mma_tile<KV>(sm, o.s), o.key0, w, o.ok, f.pages.rows, f.first_disagree, g);
    o.bad = sm.bad_keys[g];
  }
  return o;
}

template <typename T, typename KV>
__device__ __forceinline__ void issue_tile_scores(Storage& sm, const OpenTile& o, float (&sc)[16],
                                                  int g) {
#pragma unroll
  for (int i = 0; i < 16; ++i) sc[i] = 0.f;
  issue_scores<T>(sc, smem_u32(sm.q), smem_u32(mma_tile<KV>(sm, o.s)) + g * kGroupKeys * 128);
}

// The softmax of a tile whose scores have landed, P, and the issue of O += P c (not waited).
template <typename T, typename KV>
__device__ __forceinline__ void weigh_tile(Storage& sm, const MlaParams& p, const OpenTile& o,
                                           const SplitFacts& f, const ThreadRows& rows,
                                           float (&sc)[16], float (&acc)[128],
                                           SoftmaxState2 (&st)[2], int g) {
  if (o.edge) mask_scores(sc, o.key0, rows, o.ok, f.pages.rows, o.bad, g);
  float alpha[2];
  softmax_tile(sm, sc, st, rows, p.scale_log2, g, alpha);
  store_p<T>(sm, sc, rows, g);
  rescale(acc, alpha);
  issue_pv<T>(acc, smem_u32(sm.p),
              smem_u32(mma_tile<KV>(sm, o.s)) + g * (kGroupCols / 64) * kPartBytes);
}

// Every tile of the split into O and the softmax states, then the partial state. Each tile is
// released only after its P c: with two stages, tile t + 1 is in flight for the whole of tile t's
// work. (Issuing tile t + 1's scores before tile t's softmax would hold both stages at once and
// leave no copy in flight: measured slower.)
template <typename T, typename KV>
__device__ void consume_tiles(Storage& sm, const MlaParams& p, const MlaWork& w, int tiles) {
  constexpr bool k8 = sizeof(KV) == 1;
  const int g = threadIdx.x / 128;
  const ThreadRows rows = thread_rows(p, w);
  const SplitFacts f = split_facts(p, w);
  load_q(sm, p, w);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  SoftmaxState2 st[2] = {SoftmaxState2::empty(), SoftmaxState2::empty()};
  for (int t = 0; t < tiles; ++t) {
    const OpenTile tile = open_tile<T, KV>(sm, p, w, f, t, g);
    float sc[16];
    issue_tile_scores<T, KV>(sm, tile, sc, g);
    wgmma_wait<0>();
    fence_regs(sc);
    weigh_tile<T, KV>(sm, p, tile, f, rows, sc, acc, st, g);
    wgmma_wait<0>();
    fence_regs(acc);
    if (!k8) release(&sm.empty[tile.s]);
  }
  store_partial(sm, p, w, rows, acc, st, g);
}

}  // namespace pagedattn::detail::cuda::mla::sm90
