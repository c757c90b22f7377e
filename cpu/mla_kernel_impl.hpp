// The CPU backend's MLA work-item kernel (mla_kernel.hpp): included only by the isa_*.cpp files,
// each compiled with its instruction set's flags, which instantiate mla_item for their set.
// It reads each latent row of the item's blocks once, widened to f32 in a per-thread buffer, for
// all of the sequence's rows (query tokens x heads), kMlaRowTile rows at a time: the scores
// against the whole row (c and k_pe), an online softmax per row block by block, and the weighted
// sum of c, the inner loops vectorized by the compiler (omp simd). Everything is a template on
// the instruction set, so each translation unit's code is its own symbol.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "mla_kernel.hpp"

namespace pagedattn::detail::cpu {

template <class Arch>
struct MlaKernel {
  // Scores of R <= kMlaRowTile rows (q rows `q`, `width` apart) against n latent rows.
  template <int R>
  static void scores(const float* q, const float* rows, int n, int width, float* s, int s_stride) {
    for (int t = 0; t < n; ++t) {
      const float* k = rows + static_cast<std::int64_t>(t) * width;
      float d[R] = {};
      for (int r = 0; r < R; ++r) {
        const float* qr = q + static_cast<std::int64_t>(r) * width;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int x = 0; x < width; ++x) acc += qr[x] * k[x];
        d[r] = acc;
      }
      for (int r = 0; r < R; ++r) s[r * s_stride + t] = d[r];
    }
  }

  // A row's online-softmax step over its n scores, which become its weights: raises its max m,
  // adds to its sum l and returns the factor for its accumulator. A non-finite score makes the
  // row NaN for good (m, l and the factor), as the reference makes it.
  static float softmax_step(float* s, int n, float& m, float& l) {
    constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
    float mx = -std::numeric_limits<float>::infinity();
    bool finite = !std::isnan(m);
    for (int t = 0; t < n; ++t) {
      finite = finite && std::isfinite(s[t]);
      mx = std::max(mx, s[t]);
    }
    if (!finite) {
      m = l = kNaN;
      std::fill(s, s + n, kNaN);
      return kNaN;
    }
    const float m_new = std::max(m, mx);
    // While m is -inf the accumulator is 0: the factor only has to be finite.
    const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m - m_new);
    float sum = 0.f;
    for (int t = 0; t < n; ++t) {
      s[t] = std::exp(s[t] - m_new);
      sum += s[t];
    }
    m = m_new;
    l = l * alpha + sum;
    return alpha;
  }

  // acc[r] = acc[r] * alpha[r] + sum_t p[r][t] c_t over the rank values, for R rows. The
  // columns go kWeighCols at a time, whose R partial sums stay in registers over the block's
  // latent rows: each value of c is loaded once for the R rows.
  static constexpr int kWeighCols = 32;
  template <int R, int Cols>
  static void weigh_cols(const float* p, int p_stride, const float* alpha, const float* v0, int n,
                         int width, int rank, float* acc, int cols) {
    float a[R][Cols];
    for (int r = 0; r < R; ++r) {
#pragma omp simd
      for (int x = 0; x < Cols; ++x) {
        a[r][x] = x < cols ? acc[static_cast<std::int64_t>(r) * rank + x] * alpha[r] : 0.f;
      }
    }
    for (int t = 0; t < n; ++t) {
      const float* v = v0 + static_cast<std::int64_t>(t) * width;
      for (int r = 0; r < R; ++r) {
        const float w = p[r * p_stride + t];
#pragma omp simd
        for (int x = 0; x < Cols; ++x) a[r][x] += w * (x < cols ? v[x] : 0.f);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int x = 0; x < cols; ++x) acc[static_cast<std::int64_t>(r) * rank + x] = a[r][x];
    }
  }
  template <int R>
  static void weigh(const float* p, int p_stride, const float* alpha, const float* rows, int n,
                    int width, int rank, float* acc) {
    int x0 = 0;
    for (; x0 + kWeighCols <= rank; x0 += kWeighCols) {
      weigh_full<R>(p, p_stride, alpha, rows + x0, n, width, rank, acc + x0);
    }
    if (x0 < rank) {
      weigh_cols<R, kWeighCols>(p, p_stride, alpha, rows + x0, n, width, rank, acc + x0, rank - x0);
    }
  }
  // weigh_cols for a whole run of kWeighCols columns: no bounds inside the loops.
  template <int R>
  static void weigh_full(const float* p, int p_stride, const float* alpha, const float* v0, int n,
                         int width, int rank, float* acc) {
    float a[R][kWeighCols];
    for (int r = 0; r < R; ++r) {
      const float* src = acc + static_cast<std::int64_t>(r) * rank;
#pragma omp simd
      for (int x = 0; x < kWeighCols; ++x) a[r][x] = src[x] * alpha[r];
    }
    for (int t = 0; t < n; ++t) {
      const float* v = v0 + static_cast<std::int64_t>(t) * width;
      for (int r = 0; r < R; ++r) {
        const float w = p[r * p_stride + t];
#pragma omp simd
        for (int x = 0; x < kWeighCols; ++x) a[r][x] += w * v[x];
      }
    }
    for (int r = 0; r < R; ++r) {
      float* dst = acc + static_cast<std::int64_t>(r) * rank;
#pragma omp simd
      for (int x = 0; x < kWeighCols; ++x) dst[x] = a[r][x];
    }
  }

  // R rows from `row` (each attending the block's first n latent rows).
  template <int R>
  static void tile(const MlaItemContext& c, const float* q, const float* rows, int n, float* m,
                   float* l, float* acc, float* s) {
    const int BS = c.block_size;
    scores<R>(q, rows, n, c.width, s, BS);
    float alpha[R];
    for (int r = 0; r < R; ++r) alpha[r] = softmax_step(s + r * BS, n, m[r], l[r]);
    weigh<R>(s, BS, alpha, rows, n, c.width, c.rank, acc);
  }

  void operator()(const MlaItemContext& c, const WorkItem& it, float* m, float* l, float* acc,
                  MlaScratch scratch) const {
    const int H = c.num_heads, BS = c.block_size;
    const int L = c.context_lens[it.seq];
    const int row0 = c.q_indptr ? c.q_indptr[it.seq] : it.seq;
    const int n_q = c.q_indptr ? c.q_indptr[it.seq + 1] - row0 : 1;
    const int rows = n_q * H;
    std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + rows, 0.f);
    std::fill(acc, acc + static_cast<std::int64_t>(rows) * c.rank, 0.f);
    const float* q = c.q + static_cast<std::int64_t>(row0) * H * c.width;
    const int first_query_pos = L - n_q;
    for (int blk = it.block_begin; blk < it.block_end; ++blk) {
      const int nt = std::min(BS, L - blk * BS);
      if (nt <= 0) break;
      widen_latent_rows(c, c.table.block(it.seq, blk), nt, scratch.rows);
      for (int i = 0; i < n_q; ++i) {
        // Query token i attends the positions up to first_query_pos + i.
        const int n = std::clamp(first_query_pos + i - blk * BS + 1, 0, nt);
        if (n == 0) continue;
        for (int h = 0; h < H;) {
          const int r = i * H + h;
          const float* qr = q + static_cast<std::int64_t>(r) * c.width;
          float* ar = acc + static_cast<std::int64_t>(r) * c.rank;
          if (H - h >= kMlaRowTile) {
            tile<kMlaRowTile>(c, qr, scratch.rows, n, m + r, l + r, ar, scratch.scores);
            h += kMlaRowTile;
          } else {
            tile<1>(c, qr, scratch.rows, n, m + r, l + r, ar, scratch.scores);
            h += 1;
          }
        }
      }
    }
  }
};

template <class Arch>
void mla_item(const MlaItemContext& c, const WorkItem& it, float* m, float* l, float* acc,
              MlaScratch scratch) {
  MlaKernel<Arch>{}(c, it, m, l, acc, scratch);
}

}  // namespace pagedattn::detail::cpu
