#include "pagedattn/reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn {

ReferenceResult reference_decode(const DecodeArgs& a) {
  validate_shapes(a, /*require_out=*/false);
  if (a.batch > 0) {
    validate_q_indptr(a, a.q_indptr);
    validate_tree_mask(a, a.tree_mask, a.tree_mask_indptr, a.q_indptr);
    validate_tables(a, a.context_lens, a.block_table, a.q_indptr);
    validate_variant_values(a, a.alibi_slopes, a.sinks);
    validate_kv_scales(a, a.k_scales, a.v_scales);
    validate_token_scales(a, a.k_token_scales, a.v_token_scales, a.context_lens, a.block_table,
                          a.q_indptr);
  }

  const int H = a.num_heads, D = a.head_dim, G = a.group_size();
  const CacheLayout layout = a.cache_layout();
  const CacheLayout scale_layout = a.token_scale_layout();
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const double scale = a.scale ? static_cast<double>(*a.scale) : 1.0 / std::sqrt(double(D));
  const int rows = a.batch > 0 ? a.q_rows() : 0;

  ReferenceResult r;
  r.out.assign(static_cast<std::size_t>(rows) * H * D, 0.0);
  r.lse.assign(static_cast<std::size_t>(rows) * H, -std::numeric_limits<double>::infinity());
  r.tokens_share.assign(static_cast<std::size_t>(rows) * H, 0.0);

  const double cap = a.logits_soft_cap;
  const double no_sink = -std::numeric_limits<double>::infinity();
  for (int b = 0; b < a.batch; ++b) {
    const int row0 = a.q_indptr ? a.q_indptr[b] : b;
    const int n_q = a.q_indptr ? a.q_indptr[b + 1] - row0 : 1;
    for (int i = 0; i < n_q; ++i) {
      const int row = row0 + i;
      // Query token i of n_q sits at position P = L_b - n_q + i: a query of a context of
      // L = P + 1 tokens (pagedattn.hpp).
      const int L = std::max(0, a.context_lens[b] - n_q + i + 1);
      // The attended tokens: [t0, L), the whole context or the window, less the new tokens the
      // tree mask leaves out.
      const int t0 = window_first_token(L, a.window_left);
      const TreeMaskRow tree = tree_mask_row(a, b, i);
      std::vector<int> attended;
      for (int t = t0; t < L; ++t) {
        if (tree.attends(t)) attended.push_back(t);
      }
      const int n = static_cast<int>(attended.size());
      if (n == 0) {  // out = 0, lse = -inf, or the sink's logit
        if (a.sinks != nullptr) {
          for (int h = 0; h < H; ++h) r.lse[static_cast<std::size_t>(row) * H + h] = a.sinks[h];
        }
        continue;
      }
      for (int kv = 0; kv < a.num_kv_heads; ++kv) {
        // The dequantization scales (1 for unquantized caches); code x scale is exact in f64.
        const double ks = static_cast<double>(a.k_scale) * (a.k_scales ? a.k_scales[kv] : 1.f);
        const double vs = static_cast<double>(a.v_scale) * (a.v_scales ? a.v_scales[kv] : 1.f);
        // Gather the attended keys and values: one row per token, each times its own scale
        // where there are per-token scales (int4: element d times its group's, d / 32).
        const int group_len = D / token_scales_per_row(a.k_dtype, D);
        Eigen::MatrixXd K(n, D), V(n, D);
        for (int j = 0; j < n; ++j) {
          const int t = attended[j];
          const int id = table.block(b, t / a.block_size), slot = t % a.block_size;
          const std::int64_t base = layout.offset(id, kv, slot);
          const std::int64_t row = scale_layout.offset(id, kv, slot);
          for (int d = 0; d < D; ++d) {
            double kt = ks, vt = vs;
            if (a.k_token_scales != nullptr) {
              kt *= a.k_token_scales[row + d / group_len];
              vt *= a.v_token_scales[row + d / group_len];
            }
            K(j, d) = load_as_float(a.k_cache, a.k_dtype, base + d) * kt;
            V(j, d) = load_as_float(a.v_cache, a.v_dtype, base + d) * vt;
          }
        }
        const bool k_finite = K.allFinite();
        for (int g = 0; g < G; ++g) {
          const int h = kv * G + g;
          const std::size_t at = static_cast<std::size_t>(row) * H + h;
          Eigen::VectorXd q(D);
          for (int d = 0; d < D; ++d) {
            q(d) = load_as_float(a.q, a.q_dtype,
                                 row * a.q_stride() + static_cast<std::int64_t>(h) * D + d);
          }
          double* out = &r.out[at * D];
          if (!k_finite || !q.allFinite()) {
            // NaN or Inf in q or in an attended K row: NaN out and lse for this head, never a
            // value that looks valid.
            std::fill(out, out + D, std::numeric_limits<double>::quiet_NaN());
            r.lse[at] = std::numeric_limits<double>::quiet_NaN();
            r.tokens_share[at] = std::numeric_limits<double>::quiet_NaN();
            continue;
          }
          Eigen::VectorXd s = scale * (K * q);  // logits
          for (int j = 0; j < n; ++j) {
            if (cap > 0) s(j) = soft_cap(s(j), cap);
            if (a.alibi_slopes != nullptr) {
              s(j) += double(a.alibi_slopes[h]) * (attended[j] - (L - 1));
            }
          }
          const double sink = a.sinks != nullptr ? double(a.sinks[h]) : no_sink;
          const double m = std::max(s.maxCoeff(), sink);
          const Eigen::VectorXd p = (s.array() - m).exp().matrix();
          const double l = p.sum() + std::exp(sink - m);
          const Eigen::VectorXd o = V.transpose() * p / l;
          for (int d = 0; d < D; ++d) out[d] = o(d);
          r.lse[at] = m + std::log(l);
          r.tokens_share[at] = p.sum() / l;
        }
      }
    }
  }
  return r;
}

}  // namespace pagedattn
