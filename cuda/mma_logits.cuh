// The logit step of the tensor-core path (mma_path.cuh): a slice's scores become logits in log2
// units (scaled, then the variant policy's logit), non-finite logits of attended tokens are noted,
// and the tokens a row does not attend to are masked to -inf.
#pragma once

#include "mma_layout.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

// The lane's rows g and g + 8 of its warp's row tile and their logit parameters, fixed for the
// item; V is the variant policy (variant_policy.cuh).
template <typename V>
struct MmaRows {
  QueryRow qr[2];
  // The logit factor: scale * log2(e), for 8-bit codes also the K scale and the power of two a bf16
  // q was scaled by (fp8_q_fragments).
  float logit_fac[2];
  // When the variant leaves logits alone, and with positive logit factors, the logits stay unscaled
  // until the exponentials: the row max is taken on them and scaled once (a positive factor
  // keeps the max, rounding included), and each weight is one exp2 of fma(s, fac, -shift).
  // Otherwise the logits are scaled first (efac = 1).
  bool late;
  float efac[2];
  typename V::Row vrow[2];  // the variant's constants of each row
};

// Where the rows disagree on the slice from token t0 (rows_disagree): each element's own row's
// verdict (its causal bound, window and tree-mask row), bit n * 4 + e for element (n, e). The
// tree mask's offset is read here rather than kept for the item: a register held through the
// tile loop costs the one-token kernel in the same build a CTA per SM.
template <typename V>
__device__ __forceinline__ unsigned mma_keep_bits(const SplitParams& p, const MmaRows<V>& rows,
                                                  MmaWarp w, int t0, int last_pos,
                                                  const CtaItem& item) {
  const int n_q = item.n_q;
  const int at = tree_mask_at(p, item);
  const int j0 = t0 - (last_pos - (n_q - 1));  // the slice's first token among the new ones
  const unsigned tree[2] = {tree_keeps16(p, at, n_q, rows.qr[0].back, j0),
                            tree_keeps16(p, at, n_q, rows.qr[1].back, j0)};
  unsigned keep = 0u;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = n * 8 + 2 * w.q4 + (e & 1);  // the token's column in the slice
      const int r = e >> 1;
      const bool kept = row_attends(t0 + k, last_pos, rows.qr[r].back, p.plan.window_left) &&
                        ((tree[r] >> k) & 1u);
      keep |= static_cast<unsigned>(kept) << (n * 4 + e);
    }
  }
  return keep;
}

// Note slice sl's non-finite logits of attended tokens in bad (x * 0 is 0 for finite x, NaN
// otherwise; rows that are not read are zero-filled, so they add 0 unless q itself is not
// finite), scale them (unless `late`: then the scale joins the exponentials), apply the
// variant's logit, mask the rows the slice's 16 mask bits exclude (warp-uniform: only
// partial or skipped tiles) and the tokens a row does not attend to (`keep`, bit n * 4 + e
// for element (n, e)).
template <bool kMulti, typename V>
__device__ __forceinline__ void mma_logits(const V& var, MmaWarp w, const MmaRows<V>& rows,
                                           MmaTile tile, int last_pos, int sl, float (&s)[2][4],
                                           unsigned keep, float (&bad)[2][2]) {
  const int t0 = tile.t0 + sl * 16;  // the slice's first token
  const unsigned bits = (tile.mask[sl >> 1] >> ((sl & 1) * 16)) & 0xffffu;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      bad[e >> 1][n] = fmaf((keep >> (n * 4 + e)) & 1u ? s[n][e] : 0.f, 0.f, bad[e >> 1][n]);
    }
  }
  if (!rows.late) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= rows.logit_fac[e >> 1];
    }
  }
  if (var.transforms_logits()) {                // uniform: on every column of the slice
    const int rel0 = t0 + 2 * w.q4 - last_pos;  // t - (L - 1); a row's own is + back
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = var.logit(rows.vrow[e >> 1], s[n][e],
                            rel0 + n * 8 + (e & 1) + (kMulti ? rows.qr[e >> 1].back : 0));
      }
    }
  }
  if (bits != 0xffffu) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (!((bits >> (n * 8 + 2 * w.q4 + (e & 1))) & 1u)) s[n][e] = -INFINITY;
      }
    }
  }
  if (keep != 0xffu) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (!((keep >> (n * 4 + e)) & 1u)) s[n][e] = -INFINITY;
      }
    }
  }
}

}  // namespace pagedattn::detail::cuda
