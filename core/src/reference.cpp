#include "pagedattn/reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn {

ReferenceResult reference_decode(const DecodeArgs& a) {
  validate_shapes(a, /*require_out=*/false);
  if (a.batch > 0) {
    validate_tables(a, a.context_lens, a.block_table);
    validate_variant_values(a, a.alibi_slopes, a.sinks);
  }

  const int H = a.num_heads, D = a.head_dim, G = a.group_size();
  const CacheLayout layout = CacheLayout::dense(a.num_blocks, a.num_kv_heads, a.block_size, D);
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const double scale = a.scale ? static_cast<double>(*a.scale) : 1.0 / std::sqrt(double(D));

  ReferenceResult r;
  r.out.assign(static_cast<std::size_t>(a.batch) * H * D, 0.0);
  r.lse.assign(static_cast<std::size_t>(a.batch) * H, -std::numeric_limits<double>::infinity());

  const double cap = a.logits_soft_cap;
  const double no_sink = -std::numeric_limits<double>::infinity();
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    if (L == 0) {  // out = 0, lse = -inf, or the sink's logit
      if (a.sinks != nullptr) {
        for (int h = 0; h < H; ++h) r.lse[static_cast<std::size_t>(b) * H + h] = a.sinks[h];
      }
      continue;
    }
    // The attended tokens [t0, L): the whole context, or the window.
    const int t0 = window_first_token(L, a.window_left);
    const int n = L - t0;
    for (int kv = 0; kv < a.num_kv_heads; ++kv) {
      // Gather this sequence's attended keys and values: one row per token.
      Eigen::MatrixXd K(n, D), V(n, D);
      for (int i = 0; i < n; ++i) {
        const int t = t0 + i;
        const std::int64_t base =
            layout.offset(table.block(b, t / a.block_size), kv, t % a.block_size);
        for (int d = 0; d < D; ++d) {
          K(i, d) = load_as_float(a.k_cache, a.k_dtype, base + d);
          V(i, d) = load_as_float(a.v_cache, a.v_dtype, base + d);
        }
      }
      const bool k_finite = K.allFinite();
      for (int g = 0; g < G; ++g) {
        const int h = kv * G + g;
        Eigen::VectorXd q(D);
        for (int d = 0; d < D; ++d) {
          q(d) = load_as_float(a.q, a.q_dtype,
                               b * a.q_stride() + static_cast<std::int64_t>(h) * D + d);
        }
        double* out = &r.out[(static_cast<std::size_t>(b) * H + h) * D];
        if (!k_finite || !q.allFinite()) {
          // NaN or Inf in q or in a K row inside the context: NaN out and lse for this head,
          // never a value that looks valid.
          std::fill(out, out + D, std::numeric_limits<double>::quiet_NaN());
          r.lse[static_cast<std::size_t>(b) * H + h] = std::numeric_limits<double>::quiet_NaN();
          continue;
        }
        Eigen::VectorXd s = scale * (K * q);  // logits
        for (int i = 0; i < n; ++i) {
          if (cap > 0) s(i) = soft_cap(s(i), cap);
          if (a.alibi_slopes != nullptr) s(i) += double(a.alibi_slopes[h]) * (t0 + i - (L - 1));
        }
        const double sink = a.sinks != nullptr ? double(a.sinks[h]) : no_sink;
        const double m = std::max(s.maxCoeff(), sink);
        const Eigen::VectorXd p = (s.array() - m).exp().matrix();
        const double l = p.sum() + std::exp(sink - m);
        const Eigen::VectorXd o = V.transpose() * p / l;
        for (int d = 0; d < D; ++d) out[d] = o(d);
        r.lse[static_cast<std::size_t>(b) * H + h] = m + std::log(l);
      }
    }
  }
  return r;
}

}  // namespace pagedattn
