// The many-row kernel's consumer warpgroup, one tile at a time: S = Q K^T (wgmma, both operands
// in shared memory), the mask on edge tiles, the online softmax in registers (log2 units,
// pagedattn/online_softmax.hpp) and O += P V (wgmma, P from registers, V read MN-major).
//
// Thread (warp w, lane) owns accumulator rows 16 w + lane / 4 and that + 8; in every 8-column
// group i it holds columns 8 i + 2 (lane % 4) + {0, 1} of both rows.
#pragma once

#include <type_traits>

#include "../query_rows.cuh"
#include "many_rows_layout.cuh"
#include "pagedattn/online_softmax.hpp"
#include "sm90_ptx.cuh"

namespace pagedattn::detail::cuda::sm90 {

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}

// The CTA's row lr (0 .. 63) of this thread's pair r.
__device__ __forceinline__ int thread_row(int r) {
  return (threadIdx.x / 32) * 16 + (threadIdx.x % 32) / 4 + 8 * r;
}

// This thread's two rows, the keys each attends (padding rows: every key of the item) and the
// variant policy's constants of each.
template <typename V>
struct RowPair {
  QueryRow row[2];
  int lo[2], hi[2];
  typename V::Row vrow[2];
  int tree_at;    // the sequence's tree mask (tree_mask_at), -1: none
  int first_new;  // the position of the sequence's first query token
  int n_q;        // and how many there are
};

template <typename V>
__device__ inline RowPair<V> row_pair(const SplitParams& p, const V& var, const TileWork& tw) {
  RowPair<V> rp;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rp.row[r] = query_row<true>(p, tw.w.item, thread_row(r));
    rp.vrow[r] = var.row(rp.row[r].head, rp.row[r].valid);
    rp.lo[r] = tw.w.tok_lo;
    rp.hi[r] = tw.w.tok_end - 1;
    if (rp.row[r].valid) row_bounds(p, tw.w, rp.row[r].back, &rp.lo[r], &rp.hi[r]);
  }
  rp.tree_at = tree_mask_at(p, tw.w.item);
  rp.first_new = tw.w.len - tw.w.item.n_q;
  rp.n_q = tw.w.item.n_q;
  return rp;
}

// Q's rows into shared memory in the swizzled K-major layout TMA gives K; padding rows are zero
// so their logits stay finite.
template <typename T>
__device__ void load_q(SharedStorage<T>& sm, const SplitParams& p, const TileWork& tw) {
  char* base = reinterpret_cast<char*>(sm.q);
  const T* q = static_cast<const T*>(p.q);
  for (int c = threadIdx.x; c < kRows * 16; c += kConsumers) {
    const int lr = c / 16, chunk = c % 16, half = chunk / 8, col16 = chunk % 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (lr < tw.w.item.rows) {
      const QueryRow row = query_row<true>(p, tw.w.item, lr);
      const T* src = q + row.qrow * p.q_stride + static_cast<std::int64_t>(row.head) * kHeadDim;
      val = *reinterpret_cast<const uint4*>(src + chunk * 8);
    }
    *reinterpret_cast<uint4*>(base + half * kHalfBytes + lr * 128 + ((col16 ^ (lr % 8)) * 16)) =
        val;
  }
  fence_proxy_async();
  consumer_sync();
}

// S[64 x 64 keys] = Q K^T: eight k16 steps, 32 bytes apart inside a swizzled row, switching to
// the second 64-column half after four. One committed group; the caller waits.
template <typename T>
__device__ __forceinline__ void issue_scores(float (&s)[32], std::uint32_t q, std::uint32_t k) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const std::uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
    wgmma_ss_n64<T>(s, sw128_desc(q + off, 16), sw128_desc(k + off, 16), kk > 0);
  }
  wgmma_commit();
}

// O[64 x 128] += P[64 x 64 keys] V; V MN-major: 16-key steps 2048 bytes apart, the two
// 64-column halves kHalfBytes apart. One committed group; the caller waits.
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[64], const std::uint32_t (&pf)[16],
                                         std::uint32_t v) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk)
    wgmma_rs_n128<T>(o, &pf[4 * kk], sw128_desc(v + kk * 16 * 128, kHalfBytes));
  wgmma_commit();
}

// Keys outside a row's attended range, dropped by its tree-mask row, or on a page that was not
// copied, get -inf: a select, so the NaN logits of unused slots vanish.
template <typename V>
__device__ inline void mask_scores(const SplitParams& p, float (&s)[32], int key0,
                                   const RowPair<V>& rp, std::uint32_t ok, int page_rows) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = 8 * i + 2 * (lane % 4) + e, key = key0 + k;
      const bool copied = (ok >> (k / page_rows)) & 1u;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (!copied || key < rp.lo[r] || key > rp.hi[r] ||
            !tree_keeps(p, rp.tree_at, rp.n_q, rp.row[r].back, key - rp.first_new)) {
          s[4 * i + 2 * r + e] = -INFINITY;
        }
      }
    }
  }
}

// Whether some query token of the CTA's rows keeps new token j (j < 0: a token before the new
// ones) under its tree-mask row; true without a tree mask.
__device__ inline bool some_row_keeps(const SplitParams& p, const TileWork& tw, int j) {
  if (p.tree_mask == nullptr || j < 0) return true;
  const CtaItem& item = tw.w.item;
  const int at = tree_mask_at(p, item);
  const int last_tok = (item.row_begin + item.rows - 1) / p.group;
  for (int i = max(item.row_begin / p.group, j); i <= last_tok; ++i) {
    if (tree_keeps(p, at, item.n_q, item.n_q - 1 - i, j)) return true;
  }
  return false;
}

// V rows that no query may weigh (before tok_lo, at or past tok_end, on a page not copied, or a
// new token no row's tree mask keeps) may hold anything, NaN included; P is 0 there but 0 x NaN
// is not, so they are cleared before P V reads them.
template <typename T>
__device__ void clear_unread_v(const SplitParams& p, T* v, int key0, const TileWork& tw,
                               std::uint32_t ok, int page_rows) {
  char* base = reinterpret_cast<char*>(v);
  const int first_new = tw.w.len - tw.w.item.n_q;
  for (int c = threadIdx.x; c < kTileKeys * 16; c += kConsumers) {
    const int k = c / 16, half = (c % 16) / 8, key = key0 + k;
    const bool copied = (ok >> (k / page_rows)) & 1u;
    if (copied && key >= tw.w.tok_lo && key < tw.w.tok_end &&
        some_row_keeps(p, tw, key - first_new)) {
      continue;
    }
    *reinterpret_cast<uint4*>(base + half * kHalfBytes + k * 128 + (c % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  consumer_sync();
}

// Bit i set where element i of the 8 16-bit values of `c` is not finite (all exponent bits set).
template <typename T>
__device__ __forceinline__ unsigned nonfinite_lanes(uint4 c) {
  constexpr std::uint32_t kExp = std::is_same_v<T, __half> ? 0x7c00u : 0x7f80u;
  const std::uint32_t w[4] = {c.x, c.y, c.z, c.w};
  unsigned bits = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    bits |= static_cast<unsigned>((w[i] & kExp) == kExp) << (2 * i);
    bits |= static_cast<unsigned>(((w[i] >> 16) & kExp) == kExp) << (2 * i + 1);
  }
  return bits;
}

// Whether row r of the pair attends `key` of the item (page copies aside).
template <typename V>
__device__ __forceinline__ bool row_keeps(const SplitParams& p, const RowPair<V>& rp, int r,
                                          int key) {
  return key >= rp.lo[r] && key <= rp.hi[r] &&
         tree_keeps(p, rp.tree_at, rp.n_q, rp.row[r].back, key - rp.first_new);
}

// A non-finite V value of a key that some rows of the CTA attend and others drop (a later token
// under the causal rule, a token a tree mask drops, one before a row's window) would reach the
// rows that drop it as 0 x NaN in P V. So on an edge tile, after clear_unread_v, the consumers
// look for such values (one barrier when there are none, the usual case). Where there are, each
// row that attends the key gets NaN in the columns where its V is not finite (the reference
// gives them a non-finite value too), and the values are zeroed for the product. parity: that of
// the edge tiles met so far (the word of nonfinite_keys this tile uses; the other is cleared).
template <typename T, typename V>
__device__ void guard_nonfinite_v(SharedStorage<T>& sm, T* v, const SplitParams& p, int key0,
                                  const RowPair<V>& rp, int parity, float (&o)[64]) {
  char* base = reinterpret_cast<char*>(v);
  auto chunk_at = [&](int c) {  // chunk c % 16 of key c / 16, in storage order
    return reinterpret_cast<uint4*>(base + ((c % 16) / 8) * kHalfBytes + (c / 16) * 128 +
                                    (c % 8) * 16);
  };
  unsigned long long mine = 0;
  for (int c = threadIdx.x; c < kTileKeys * 16; c += kConsumers) {
    if (nonfinite_lanes<T>(*chunk_at(c)) != 0) mine |= 1ull << (c / 16);
  }
  if (mine != 0) atomicOr(&sm.nonfinite_keys[parity], mine);
  consumer_sync();
  const unsigned long long bad =
      *static_cast<volatile unsigned long long*>(&sm.nonfinite_keys[parity]);
  if (threadIdx.x == 0) sm.nonfinite_keys[parity ^ 1] = 0;
  if (bad == 0) return;  // uniform
  const int lane = threadIdx.x % 32;
  for (int k = 0; k < kTileKeys; ++k) {
    if (!((bad >> k) & 1ull)) continue;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!row_keeps(p, rp, r, key0 + k)) continue;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // Column col's value: in half col / 64, 16-byte chunk (col % 64) / 8 swizzled by k % 8.
          const int col = 8 * i + 2 * (lane % 4) + e, chunk = (col % 64) / 8;
          const T* x = reinterpret_cast<const T*>(base + (col / 64) * kHalfBytes + k * 128 +
                                                  ((chunk ^ (k % 8)) * 16)) +
                       col % 8;
          if (!isfinite(static_cast<float>(*x))) o[4 * i + 2 * r + e] = NAN;
        }
      }
    }
  }
  consumer_sync();  // every row read V before it is zeroed
  for (int c = threadIdx.x; c < kTileKeys * 16; c += kConsumers) {
    if (!((bad >> (c / 16)) & 1ull)) continue;
    uint4* at = chunk_at(c);
    const unsigned lanes = nonfinite_lanes<T>(*at);
    if (lanes == 0) continue;
    std::uint32_t w[4] = {at->x, at->y, at->z, at->w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if ((lanes >> (2 * i)) & 1u) w[i] &= 0xffff0000u;
      if ((lanes >> (2 * i + 1)) & 1u) w[i] &= 0x0000ffffu;
    }
    *at = make_uint4(w[0], w[1], w[2], w[3]);
  }
  fence_proxy_async();
  consumer_sync();
}

// The variant's logit on every score of the tile (scaled into log2 units first), for a policy
// that transforms logits; before the mask, which then leaves -inf where it must. A non-finite
// score becomes NaN, not the policy's value of it (a soft-capped Inf would look finite), so that
// it poisons its row as it does without a variant.
template <typename V>
__device__ inline void variant_scores(const V& var, float (&s)[32], int key0, int last_pos,
                                      const RowPair<V>& rp, float scale_log2) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + 8 * i + 2 * (lane % 4) + e;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float& x = s[4 * i + 2 * r + e];
        x = isfinite(x) ? var.logit(rp.vrow[r], x * scale_log2, key - last_pos + rp.row[r].back)
                        : NAN;
      }
    }
  }
}

// One tile's online softmax: raises each row's max, returns in alpha the factor for what O
// holds, and turns s into the weights exp2(s scale - max), added to the row's (this thread's
// share of the) sum.
__device__ inline void softmax_tile(float (&s)[32], SoftmaxState2 (&st)[2], float scale_log2,
                                    float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    alpha[r] = st[r].rescale_to(mx * scale_log2);
    const float shift = st[r].shift();
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
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

// O *= alpha per row, and P packed as the A fragments of the P V step: the accumulator pairs of
// 8-column groups 2 kk and 2 kk + 1 are the m64k16 A fragment of k step kk.
template <typename T>
__device__ __forceinline__ void rescale_and_pack(float (&o)[64], const float (&alpha)[2],
                                                 const float (&s)[32], std::uint32_t (&pf)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    o[4 * i] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) pf[i] = WgmmaType<T>::pack(s[2 * i], s[2 * i + 1]);
}

// Each consumer warp tells the producer it is done with a stage.
__device__ __forceinline__ void release(std::uint64_t* empty) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) mbar_arrive(empty);
}

// Every tile of the item into o and st: S, the mask where the tile needs one, the softmax and
// P V, each waited for before the next (two CTAs per SM overlap one's softmax with the other's
// MMAs).
template <typename T, typename V>
__device__ void consume_tiles(SharedStorage<T>& sm, const SplitParams& p, const V& var,
                              const TileWork& tw, const RowPair<V>& rp, float (&o)[64],
                              SoftmaxState2 (&st)[2]) {
  // Scores stay unscaled until the exponentials, unless the variant transforms them.
  const bool transforms = var.transforms_logits();
  const float exp_scale = transforms ? 1.f : p.scale_log2;
  const PageGeom g = page_geom(p.block_size);
  const std::uint32_t all_pages = (1u << g.pages_per_tile) - 1u;
  const std::uint32_t q = smem_u32(sm.q);
  int edges = 0;  // edge tiles met (guard_nonfinite_v)
  for (int t = 0; t < tw.tiles; ++t) {
    const int s = t % kStages, key0 = tw.w.tok_begin + t * kTileKeys;
    const std::uint32_t ok = tile_pages_copied(p, tw, key0);
    mbar_wait(&sm.full[s], (t / kStages) & 1);
    float sc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) sc[i] = 0.f;
    issue_scores<T>(sc, q, smem_u32(sm.k[s]));
    wgmma_wait<0>();
    fence_regs(sc);
    if (transforms) variant_scores(var, sc, key0, tw.w.len - 1, rp, p.scale_log2);
    // Uniform across the CTA: the tile leaves the keys every row attends, or misses a page.
    if (key0 < tw.all_lo || key0 + kTileKeys - 1 > tw.all_hi || ok != all_pages) {
      mask_scores(p, sc, key0, rp, ok, g.page_rows);
      clear_unread_v(p, sm.v[s], key0, tw, ok, g.page_rows);
      guard_nonfinite_v(sm, sm.v[s], p, key0, rp, edges++ & 1, o);
    }
    float alpha[2];
    std::uint32_t pf[16];
    softmax_tile(sc, st, exp_scale, alpha);
    rescale_and_pack<T>(o, alpha, sc, pf);
    issue_pv<T>(o, pf, smem_u32(sm.v[s]));
    wgmma_wait<0>();
    fence_regs(o);
    release(&sm.empty[s]);
  }
}

}  // namespace pagedattn::detail::cuda::sm90
