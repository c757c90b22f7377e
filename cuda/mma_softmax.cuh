// The online-softmax step of the tensor-core path (mma_path.cuh): one row max, rescale and pass
// of exponentials for the logits of a fold, the accumulator's rescale, and the rows' states
// finished after the last tile.
#pragma once

#include "pagedattn/online_softmax.hpp"

namespace pagedattn::detail::cuda {

// The largest (or the sum) of N values by a balanced tree: log2(N) dependent steps instead of N.
template <int N, typename Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2) {
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) v[i] = op(v[i], v[i + w]);
  }
  return v[0];
}

// Row r's logits of NS slices (rows g and g + 8 of the lane's quad: r = 0, 1), gathered for a
// reduction that may overwrite them.
template <int NS>
__device__ __forceinline__ void row_values(const float (&s)[NS][2][4], int r, float (&v)[4 * NS]) {
#pragma unroll
  for (int j = 0; j < NS; ++j) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      v[4 * j + 2 * n] = s[j][n][2 * r];
      v[4 * j + 2 * n + 1] = s[j][n][2 * r + 1];
    }
  }
}

// Folds the logits s of NS slices into the states st of rows g and g + 8 (the lanes of a quad
// hold the same max and partial sums of their own columns): s becomes the weights, alpha each
// row's rescale factor for the accumulator.
template <int NS>
__device__ __forceinline__ void mma_softmax(float (&s)[NS][2][4], const float (&efac)[2],
                                            SoftmaxState2 (&st)[2], float (&alpha)[2]) {
  // Row max (rows g and g + 8; a quad shares a row), in the logits' units: scaled by
  // efac = logit_fac > 0 (late) after the max, which rounding leaves the max.
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v[4 * NS];
    row_values(s, r, v);
    mx[r] = tree_reduce(v, [](float x, float y) { return fmaxf(x, y); });
  }
  float shift[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    alpha[r] = st[r].rescale_to(mx[r] * efac[r]);
    shift[r] = st[r].shift();
  }
  // The weights exp2(s * efac - shift) (0 for a masked -inf: efac > 0) and their row sums.
  float ps[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = s[j][n][2 * r + c];
          x = Log2Exp::exp(fmaf(x, efac[r], -shift[r]));
        }
      }
    }
    float v[4 * NS];
    row_values(s, r, v);
    ps[r] = tree_reduce(v, [](float x, float y) { return x + y; });
  }
  st[0].add(ps[0]);
  st[1].add(ps[1]);
}

// Rescales the accumulator only when some row's max grew (alpha is exactly 1 otherwise):
// after the first tiles of a split the max rarely moves.
template <int D>
__device__ __forceinline__ void mma_rescale(float (&o)[D / 8][4], const float (&alpha)[2]) {
  if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
  }
}

// After the last tile: the quad's partial sums added up; bad (NaN once a row met a non-finite
// logit, mma_logits) makes the row's state NaN (m = l = NaN), which every merge after this one,
// and the combine, carry through to out and lse (as the CPU backend does).
__device__ __forceinline__ void mma_finish_rows(SoftmaxState2 (&st)[2], const float (&bad)[2][2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 1);
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 2);
    float b = bad[r][0] + bad[r][1];
    b += __shfl_xor_sync(0xffffffffu, b, 1);
    b += __shfl_xor_sync(0xffffffffu, b, 2);
    if (b != 0.f) st[r].m = st[r].l = NAN;
  }
}

}  // namespace pagedattn::detail::cuda
