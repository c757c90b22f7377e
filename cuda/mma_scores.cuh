// The score step of the tensor-core path (mma_path.cuh): Q's A fragments, loaded once per item,
// and S = Q K^T of a warp's 16-token slices of a tile, K through ldmatrix as the B operand (for
// f32 caches in 3xTF32, tf32_frags.cuh).
#pragma once

#include <cstdint>

#include "fp8_frags.cuh"
#include "kv_pipeline.cuh"
#include "mma_layout.cuh"
#include "ptx.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"
#include "tf32_frags.cuh"

namespace pagedattn::detail::cuda {

// Where the 8-bit path keeps k-step kk of the warp's row tile, with Q in shared memory.
template <int D>
__device__ __forceinline__ char* q_frag_at(char* sQ, int wh, int lane, int kk) {
  return sQ + ((wh * (D / 16) + kk) * 32 + lane) * 16;
}

// Q of the CTA's rows (q = p.q) as A fragments: into registers (qf) or shared memory (sQ).
// qr: the lane's rows g and g + 8. For 8-bit codes, logit_fac also takes the K scale and the power
// of two a bf16 q was scaled by (fp8_q_fragments).
template <typename T, int D, bool kMulti>
__device__ __forceinline__ void mma_load_q(const SplitParams& p, const CtaItem& item, const T* q,
                                           MmaWarp w, const QueryRow (&qr)[2], char* sQ,
                                           std::uint32_t (&qf)[MmaCfg<T, D>::kQK][4],
                                           float (&logit_fac)[2]) {
  using Cfg = MmaCfg<T, D>;
  if constexpr (Cfg::kTf32) {
    // The warps of a row tile share its fragments: the first one stores them.
    if (w.wt == 0) tf32_store_q<D>(q, p.q_stride, qr, w.wh, w.lane, w.q4, sQ);
  } else if constexpr (Cfg::kCodes) {
    fp8_q_fragments<D>(p, qr, w.q4, head_scale(p.k_scale, p.k_scales, item.kv), logit_fac,
                       [&](int kk, const std::uint32_t(&a)[4]) {
                         if constexpr (Cfg::kQInSmem) {
                           if (w.wt == 0) {
                             *reinterpret_cast<uint4*>(q_frag_at<D>(sQ, w.wh, w.lane, kk)) =
                                 make_uint4(a[0], a[1], a[2], a[3]);
                           }
                         } else {
#pragma unroll
                           for (int r = 0; r < 4; ++r) qf[kk][r] = a[r];
                         }
                       });
  } else if constexpr (Cfg::kQInSmem) {
    constexpr int CH = RowGeom<T, D>::kChunks;
    for (int idx = w.tid; idx < w.WH * 16 * CH; idx += kThreads) {
      const int r = idx / CH, c = idx - r * CH;
      const QueryRow row = query_row<kMulti>(p, item, r);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row.valid) {
        v = *reinterpret_cast<const uint4*>(
            reinterpret_cast<const char*>(q + row.qrow * p.q_stride +
                                          static_cast<std::int64_t>(row.head) * D) +
            c * 16);
      }
      *reinterpret_cast<uint4*>(sQ + RowGeom<T, D>::offset(r, c)) = v;
    }
  } else {
    // A fragments straight from global: a0 (row g, k 2q4), a1 (row g+8), a2 (k+8), a3.
    const T* qrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      qrow[r] = q + qr[r].qrow * p.q_stride + static_cast<std::int64_t>(qr[r].head) * D;
    }
#pragma unroll
    for (int kk = 0; kk < Cfg::kQK; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = kk * 16 + 2 * w.q4 + (r >> 1) * 8;
        qf[kk][r] =
            qr[r & 1].valid ? *reinterpret_cast<const std::uint32_t*>(qrow[r & 1] + col) : 0u;
      }
    }
  }
}

// The accumulator of slice j at k-step kk: a slice alone sums its odd steps into s_odd.
template <int NS>
__device__ __forceinline__ auto acc_of(float (&s)[NS][2][4], float (&s_odd)[2][4], int j, int kk)
    -> float (&)[2][4] {
  return NS == 1 && kk % 2 == 1 ? s_odd : s[j];
}

// S = Q K^T of the NS slices sl0, sl0 + WT, ... of tile kS over D / 16 k-steps, k-step outer so
// each Q fragment read from shared memory serves every slice. One slice alone accumulates into
// two sets (even and odd steps, summed after) so its dependent MMA chains are half as long;
// several slices are independent chains already.
template <typename T, int D, int NS>
__device__ __forceinline__ void mma_scores(MmaWarp w, MmaQSmem qs,
                                           const std::uint32_t (&qf)[MmaCfg<T, D>::kQK][4],
                                           const int (&k_at)[4], const char* kS, int sl0,
                                           float (&s)[NS][2][4]) {
  using Cfg = MmaCfg<T, D>;
  using Op = MmaOp<typename Cfg::MmaT>;
  using Geo = RowGeom<T, D>;
  float s_odd[2][4];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s_odd[n][e] = 0.f;
#pragma unroll
      for (int j = 0; j < NS; ++j) s[j][n][e] = 0.f;
    }
  }
  if constexpr (Cfg::kTf32) {
    // k-steps of 8 dims: the ldmatrix of the 16-bit path (tf32_frags.cuh), Q's split fragments
    // from shared memory, three MMAs per n-tile.
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk) {
      const Tf32A a = tf32_load_q<D>(qs.base, w.wh, w.lane, kk);
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        std::uint32_t bk[4];
        ldmatrix_x4(bk, kS + (sl0 + j * w.WT) * 16 * Cfg::ROW + k_at[kk % 4] + (kk / 4) * 128);
        float(&acc)[2][4] = acc_of<NS>(s, s_odd, j, kk);
        mma_3xtf32(acc[0], a, bk[0], bk[1]);
        mma_3xtf32(acc[1], a, bk[2], bk[3]);
      }
    }
  } else if constexpr (Cfg::kCodes) {
    // One ldmatrix: tokens 0-7 and 8-15 of chunks 2 j and 2 j + 1, i.e. k-steps 2 jj, 2 jj + 1.
#pragma unroll
    for (int jj = 0; jj < D / 32; ++jj) {
      std::uint32_t a[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (Cfg::kQInSmem) {
          const uint4 av =
              *reinterpret_cast<const uint4*>(q_frag_at<D>(qs.base, w.wh, w.lane, 2 * jj + h));
          a[h][0] = av.x, a[h][1] = av.y, a[h][2] = av.z, a[h][3] = av.w;
        } else {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[h][r] = qf[2 * jj + h][r];
        }
      }
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        std::uint32_t raw[4];
        ldmatrix_x4(raw, kS + (sl0 + j * w.WT) * 16 * Cfg::ROW + k_at[jj % 4] + (jj / 4) * 128);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          std::uint32_t bk[4];
          fp8_k_regs<T>(raw[h], bk[0], bk[1]);
          fp8_k_regs<T>(raw[2 + h], bk[2], bk[3]);
          float(&acc)[2][4] = acc_of<NS>(s, s_odd, j, 2 * jj + h);
          Op::mma(acc[0], a[h], bk[0], bk[1]);
          Op::mma(acc[1], a[h], bk[2], bk[3]);
        }
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      if constexpr (Cfg::kQInSmem) {
        ldmatrix_x4(a, qs.base + Geo::offset(w.wh * 16 + qs.row, 2 * kk + qs.half));
      } else {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = qf[kk][r];
      }
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        std::uint32_t bk[4];
        ldmatrix_x4(bk, kS + (sl0 + j * w.WT) * 16 * Cfg::ROW + k_at[kk % 4] + (kk / 4) * 128);
        float(&acc)[2][4] = acc_of<NS>(s, s_odd, j, kk);
        Op::mma(acc[0], a, bk[0], bk[1]);
        Op::mma(acc[1], a, bk[2], bk[3]);
      }
    }
  }
  if constexpr (NS == 1) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][n][e] += s_odd[n][e];
    }
  }
}

}  // namespace pagedattn::detail::cuda
