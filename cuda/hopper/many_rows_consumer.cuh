// The many-row kernel's consumer warpgroup, one tile at a time: S = Q K^T (wgmma, both operands
// in shared memory), the mask on edge tiles, the online softmax in registers (log2 units,
// pagedattn/online_softmax.hpp) and O += P V (wgmma, P from registers, V read MN-major).
//
// Thread (warp w, lane) owns accumulator rows 16 w + lane / 4 and that + 8; in every 8-column
// group i it holds columns 8 i + 2 (lane % 4) + {0, 1} of both rows.
#pragma once

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

// Keys outside a row's attended range, or on a page that was not copied, get -inf: a select, so
// the NaN logits of unused slots vanish.
template <typename V>
__device__ inline void mask_scores(float (&s)[32], int key0, const RowPair<V>& rp, std::uint32_t ok,
                                   int page_rows) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = 8 * i + 2 * (lane % 4) + e, key = key0 + k;
      const bool copied = (ok >> (k / page_rows)) & 1u;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (!copied || key < rp.lo[r] || key > rp.hi[r]) s[4 * i + 2 * r + e] = -INFINITY;
      }
    }
  }
}

// V rows that no query may weigh (before tok_lo, at or past tok_end, or on a page not copied)
// may hold anything, NaN included; P is 0 there but 0 x NaN is not, so they are cleared before
// P V reads them.
template <typename T>
__device__ void clear_unread_v(T* v, int key0, const TileWork& tw, std::uint32_t ok,
                               int page_rows) {
  char* base = reinterpret_cast<char*>(v);
  for (int c = threadIdx.x; c < kTileKeys * 16; c += kConsumers) {
    const int k = c / 16, half = (c % 16) / 8, key = key0 + k;
    const bool copied = (ok >> (k / page_rows)) & 1u;
    if (copied && key >= tw.w.tok_lo && key < tw.w.tok_end) continue;
    *reinterpret_cast<uint4*>(base + half * kHalfBytes + k * 128 + (c % 8) * 16) =
        make_uint4(0, 0, 0, 0);
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
      mask_scores(sc, key0, rp, ok, g.page_rows);
      clear_unread_v(sm.v[s], key0, tw, ok, g.page_rows);
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
