// The MLA decode kernel (pagedattn/mla.hpp, docs/mla.md): one CTA per (sequence, split, chunk of
// 16 query rows), the rows being the sequence's (query token, head) pairs, all on the one latent
// row per token. It walks its split's tokens in tiles of 64 latent rows, each copied once with
// cp.async into shared memory (two stages; 8-bit caches land raw and are widened into one 16-bit
// tile, exactly: mla_tiles.cuh), and for each tile:
//   S = Q [c | k_pe]^T    warp w: keys 8w .. 8w + 7 over the whole width (m16n8k16 MMAs)
//   online softmax        16 threads per row, in log2 units; P to shared memory in the 16-bit
//                         type, as hi + lo parts where the output needs f32-level weights
//   O += P c              warp w: columns w * rank / 8 onward, over the tile's 64 keys
// then writes its partial state (m, l, O) in the combine's layout (combine.cuh), which merges the
// splits and writes out and lse. The V operand is the tile's c part itself: a latent row is read
// from memory once per CTA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "../ptx.cuh"
#include "mla_params.cuh"
#include "mla_tiles.cuh"
#include "pagedattn/online_softmax.hpp"

namespace pagedattn::detail::cuda::mla {

// Warp w's 16 x 8 scores of keys 8w .. 8w + 7 of the tile at byte offset `tile`: c[0], c[1] for
// row g = lane / 4 and keys 2 (lane % 4), + 1; c[2], c[3] for row g + 8.
template <typename T>
__device__ inline void tile_scores(const SmemLayout& L, const char* smem, int tile, int width,
                                   float (&c)[4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const char* q = smem + L.q + ((lane % 16) * L.ld + (lane / 16) * 8) * 2;
  const char* k = smem + tile + ((8 * warp + lane % 8) * L.ld + (lane / 8) * 8) * 2;
  const char* k2 = smem + tile + ((8 * warp + lane % 8) * L.ld + ((lane / 8) & 1) * 8) * 2;
  // Even and odd 16-dim steps accumulate apart: two MMA chains in flight instead of one.
  float odd[4] = {0.f, 0.f, 0.f, 0.f};
  c[0] = c[1] = c[2] = c[3] = 0.f;
  const int steps = width / 16;
  int kk = 0;
#pragma unroll 4
  for (; kk + 2 <= steps; kk += 2) {
    std::uint32_t b[4], a0[4], a1[4];
    ldmatrix_x4(b, k + kk * 32);  // keys x dims 16 kk .. 16 kk + 31
    ldmatrix_x4(a0, q + kk * 32);
    ldmatrix_x4(a1, q + kk * 32 + 32);
    MmaOp<T>::mma(c, a0, b[0], b[1]);
    MmaOp<T>::mma(odd, a1, b[2], b[3]);
  }
  if (kk < steps) {  // an odd number of 16-dim steps (rope_dim 16 or 48)
    std::uint32_t b[2], a[4];
    ldmatrix_x2(b, k2 + kk * 32);
    ldmatrix_x4(a, q + kk * 32);
    MmaOp<T>::mma(c, a, b[0], b[1]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] += odd[e];
}

// A softmax thread's row (16 threads per row, each 4 keys of the tile) and its running state.
struct SoftmaxRow {
  int lr;   // row within the CTA
  int end;  // the row attends keys [tok_begin, end)
  SoftmaxState2 st;
};

// Folds the tile's scores of keys key0 .. key0 + 63 into the row's state, writes its weights P
// (hi, and lo = p - hi where split_p) and, from one thread per row, the accumulator factor.
template <typename T>
__device__ inline void tile_softmax(const MlaParams& p, const SmemLayout& L, char* smem, int key0,
                                    bool guarded, SoftmaxRow& r) {
  const int j = threadIdx.x % 16;
  const float4 d =
      *reinterpret_cast<const float4*>(smem + L.scores + (r.lr * kTileKeys + 4 * j) * 4);
  const int* bad = reinterpret_cast<const int*>(smem + L.bad_keys);
  float x[4] = {d.x, d.y, d.z, d.w};
  float tile_max = -INFINITY;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int t = key0 + 4 * j + e;
    x[e] = t < r.end ? (guarded && bad[4 * j + e] ? NAN : x[e] * p.scale_log2) : -INFINITY;
    tile_max = fmaxf(tile_max, x[e]);
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, o));
  const float alpha = r.st.rescale_to(tile_max);
  float sum = 0.f;
  std::uint32_t hi[2], lo[2];
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const float w0 = r.st.weight(x[e]), w1 = r.st.weight(x[e + 1]);
    sum += w0 + w1;
    hi[e / 2] = MmaOp<T>::pack(w0, w1);
    float h0, h1;
    MmaOp<T>::unpack(hi[e / 2], h0, h1);
    lo[e / 2] = MmaOp<T>::pack(w0 - h0, w1 - h1);
  }
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
  r.st.add(sum);
  const int at = (r.lr * kPRow + 4 * j) * 2;
  *reinterpret_cast<uint2*>(smem + L.p_hi + at) = make_uint2(hi[0], hi[1]);
  if (p.split_p) *reinterpret_cast<uint2*>(smem + L.p_lo + at) = make_uint2(lo[0], lo[1]);
  if (j == 0) reinterpret_cast<float*>(smem + L.alpha)[r.lr] = alpha;
}

// O += P c over the tile for warp w's columns (nt n-tiles of 8 from column c0), after scaling
// the accumulators by the rows' factors.
template <typename T>
__device__ inline void tile_pv(const MlaParams& p, const SmemLayout& L, const char* smem, int tile,
                               float (&acc)[8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nt = p.rank / 64, c0 = warp * (p.rank / 8);
  const float* alpha = reinterpret_cast<const float*>(smem + L.alpha);
  const float a_lo = alpha[lane / 4], a_hi = alpha[lane / 4 + 8];
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    acc[n][0] *= a_lo;
    acc[n][1] *= a_lo;
    acc[n][2] *= a_hi;
    acc[n][3] *= a_hi;
  }
  const char* ph = smem + L.p_hi + ((lane % 16) * kPRow + (lane / 16) * 8) * 2;
  const char* pl = smem + L.p_lo + ((lane % 16) * kPRow + (lane / 16) * 8) * 2;
  const char* v =
      smem + tile + ((((lane / 8) & 1) * 8 + lane % 8) * L.ld + c0 + 8 * (lane / 16)) * 2;
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk) {
    std::uint32_t a[4], a_low[4];
    ldmatrix_x4(a, ph + kk * 32);
    if (p.split_p) ldmatrix_x4(a_low, pl + kk * 32);
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      if (n >= nt) break;
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v + (16 * kk * L.ld + 8 * n) * 2);
      MmaOp<T>::mma(acc[n], a, b[0], b[1]);
      MmaOp<T>::mma(acc[n + 1], a, b[2], b[3]);
      if (p.split_p) {
        MmaOp<T>::mma(acc[n], a_low, b[0], b[1]);
        MmaOp<T>::mma(acc[n + 1], a_low, b[2], b[3]);
      }
    }
  }
}

// Q's 16 rows (zeros for rows past the sequence's) into shared memory.
template <typename T>
__device__ inline void load_q(const MlaParams& p, const SmemLayout& L, char* smem,
                              const MlaWork& w) {
  const int width = p.rank + p.rope;
  std::uint16_t* q = reinterpret_cast<std::uint16_t*>(smem + L.q);
  for (int e = threadIdx.x; e < kRows * width; e += kThreads) {
    const int lr = e / width, d = e - lr * width;
    const int r = w.row0 + lr;
    std::uint16_t v = 0;
    if (r < w.n_rows) {
      const int i = r / p.heads, h = r - i * p.heads;
      const long long row = w.sq.row0 + i;
      v = d < p.rank ? __ldg(static_cast<const std::uint16_t*>(p.q_nope) + row * p.q_nope_row +
                             h * p.q_nope_head + d)
                     : __ldg(static_cast<const std::uint16_t*>(p.q_pe) + row * p.q_pe_row +
                             h * p.q_pe_head + d - p.rank);
    }
    q[lr * L.ld + d] = v;
  }
}

// The CTA's partial state: O (times the cache scale) and (m, l) of its valid rows.
__device__ inline void store_partial(const MlaParams& p, const MlaWork& w, const float (&acc)[8][4],
                                     const SoftmaxRow& r) {
  const long long rows = static_cast<long long>(p.max_q) * p.heads;  // per split
  const long long part = (static_cast<long long>(w.b) * p.splits + w.split) * rows + w.row0;
  if (threadIdx.x % 16 == 0 && w.row0 + r.lr < w.n_rows) {
    // A NaN that reached l makes m NaN too: the combine then keeps it whatever the other splits.
    const float m = r.st.l != r.st.l ? NAN : r.st.m;
    *reinterpret_cast<float2*>(p.part_ml + 2 * (part + r.lr)) = make_float2(m, r.st.l);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nt = p.rank / 64, c0 = warp * (p.rank / 8) + 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int lr = lane / 4 + 8 * half;
    if (w.row0 + lr >= w.n_rows) continue;
    float* row = p.part_acc + (part + lr) * p.rank + c0;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      if (n >= nt) break;
      *reinterpret_cast<float2*>(row + 8 * n) =
          make_float2(acc[n][2 * half] * p.out_scale, acc[n][2 * half + 1] * p.out_scale);
    }
  }
}

template <typename T, typename KV>
__global__ void __launch_bounds__(kThreads, 1) mla_kernel(const MlaParams p) {
  extern __shared__ __align__(16) char smem[];
  constexpr bool k8 = sizeof(KV) == 1;
  const int width = p.rank + p.rope;
  const SmemLayout L = smem_layout(width, k8);
  const MlaWork w = mla_work(p);
  if (w.split == 0 && w.row0 == 0 && threadIdx.x == 0) {
    if (w.b == 0) p.split_offset[0] = 0;
    p.split_offset[w.b + 1] = (w.b + 1) * p.splits;
  }
  if (w.row0 >= w.n_rows) return;  // no query row of the sequence in this chunk (uniform)
  init_tile_barriers(L, smem);
  load_q<T>(p, L, smem, w);
  SoftmaxRow r;
  r.lr = threadIdx.x / 16;
  {
    const int row = w.row0 + r.lr;
    r.end = row < w.n_rows ? min(w.len - w.sq.n + row / p.heads + 1, w.tok_end) : INT_MIN;
    r.st = SoftmaxState2::empty();
  }
  float acc[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  const int tiles =
      w.tok_end > w.tok_begin ? (w.tok_end - w.tok_begin + kTileKeys - 1) / kTileKeys : 0;
  // Keys from here on are attended by some of the sequence's query tokens and not others.
  const int first_disagree = w.sq.n > 1 ? w.len - w.sq.n + 1 : INT_MAX;
  __syncthreads();  // Q and the copy barriers are ready
  if (tiles > 0) issue_tile<KV>(p, L, smem, w, w.tok_begin, 0);
  for (int it = 0; it < tiles; ++it) {
    const int key0 = w.tok_begin + it * kTileKeys;
    const bool next = it + 1 < tiles;
    if (next) issue_tile<KV>(p, L, smem, w, key0 + kTileKeys, (it + 1) & 1);
    wait_tile(L, smem, it, next);
#if __CUDA_ARCH__ < 900
    __syncthreads();  // every thread's copies of the tile have landed
#endif
    const int tile = k8 || (it & 1) == 0 ? L.tile0 : L.tile1;
    const bool guarded = key0 + kTileKeys > first_disagree;
    if (k8) widen_tile<T, KV>(p, L, smem, it & 1);
    if (k8 && guarded) __syncthreads();
    if (guarded) guard_nonfinite<T>(p, L, smem, tile, key0, first_disagree);
    if (k8 || guarded) __syncthreads();
    float s[4];
    tile_scores<T>(L, smem, tile, width, s);
    {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      float* scores = reinterpret_cast<float*>(smem + L.scores);
      const int g = lane / 4, key = 8 * warp + 2 * (lane % 4);
      *reinterpret_cast<float2*>(scores + g * kTileKeys + key) = make_float2(s[0], s[1]);
      *reinterpret_cast<float2*>(scores + (g + 8) * kTileKeys + key) = make_float2(s[2], s[3]);
    }
    __syncthreads();
    tile_softmax<T>(p, L, smem, key0, guarded, r);
    __syncthreads();
    tile_pv<T>(p, L, smem, tile, acc);
    __syncthreads();  // before the next copies and scores overwrite what this tile read
  }
  store_partial(p, w, acc, r);
}

}  // namespace pagedattn::detail::cuda::mla
