// Per-token K and V scales on the tensor-core path (mma_path.cuh, the token-scale build of a
// quantized cache: SplitBuild::token_scales). The pipeline brings each tile's scales into shared
// memory beside its masks (KvPipeline::token_scales: 0 for rows not read).
//
// K: q . (code x s_k) = (q . code) x s_k, so each score is multiplied by its token's K scale
// before the logit step (the max, the variant and the masks then see the true score).
//
// V: the weight p of a token multiplies its V scale s_v before P V. The product goes to the
// tensor cores as f16 (the fragments' type of a quantized cache), whose range p x s_v could leave
// for scales far from 1 (below 2^-14 it loses bits, above 65504 it is infinite). So the warp keeps
// its accumulator in units of vmax, the largest V scale it has met: the fragment carries
// p x s_v / vmax, in [0, 1], and a larger vmax shrinks the accumulator by old / new, folded into
// the online softmax's rescale factor. The epilogue multiplies the unit back (mma_stash). The
// softmax's sums take p alone: the scales weigh the values, not the distribution.
#pragma once

#include "mma_layout.cuh"

namespace pagedattn::detail::cuda {

// The scale of element (n, c) of slice sl's score fragment (c: the lane's column 2 q4 + c of
// n-tile n), from a tile's TT scales.
__device__ __forceinline__ float slice_token_scale(const float* scales, MmaWarp w, int sl, int n,
                                                   int c) {
  return scales[sl * 16 + n * 8 + 2 * w.q4 + c];
}

// The scores s of NS slices (sl0, sl0 + WT, ...) times their tokens' K scales (k_scales: the
// tile's).
template <int NS>
__device__ __forceinline__ void scale_scores_by_token(const float* k_scales, MmaWarp w, int sl0,
                                                      float (&s)[NS][2][4]) {
#pragma unroll
  for (int j = 0; j < NS; ++j) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float ks = slice_token_scale(k_scales, w, sl0 + j * w.WT, n, c);
        s[j][n][c] *= ks;      // row g
        s[j][n][2 + c] *= ks;  // row g + 8
      }
    }
  }
}

// The weights s of NS slices times their tokens' V scales (v_scales: the tile's) in units of the
// warp's running largest V scale vmax (0 before the first tile), which grows to the largest
// scale of the slices' tokens that some row of the warp weighs (a masked token's weight is 0,
// and its scale, which may be anything in range, must not shrink the others' weights to
// nothing); alpha, the rows' rescale factors, then also take old / new. The largest is taken
// over the whole warp, so vmax stays uniform over it.
template <int NS>
__device__ __forceinline__ void scale_weights_by_token(const float* v_scales, MmaWarp w, int sl0,
                                                       float (&s)[NS][2][4], float& vmax,
                                                       float (&alpha)[2]) {
  float vs[NS][2][2];
  float most = 0.f;
#pragma unroll
  for (int j = 0; j < NS; ++j) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        vs[j][n][c] = slice_token_scale(v_scales, w, sl0 + j * w.WT, n, c);
        if (s[j][n][c] > 0.f || s[j][n][2 + c] > 0.f) most = fmaxf(most, vs[j][n][c]);
      }
    }
  }
#pragma unroll
  for (int lanes = 1; lanes < 32; lanes *= 2) {
    most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, lanes));
  }
  if (most > vmax) {
    const float shrink = vmax / most;  // 0 on the first tile, where the accumulator is 0
    alpha[0] *= shrink;
    alpha[1] *= shrink;
    vmax = most;
  }
  const float inv = vmax > 0.f ? 1.f / vmax : 0.f;  // all scales 0: every value is 0
#pragma unroll
  for (int j = 0; j < NS; ++j) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float f = vs[j][n][c] * inv;
        s[j][n][c] *= f;
        s[j][n][2 + c] *= f;
      }
    }
  }
}

}  // namespace pagedattn::detail::cuda
