#include "pagedattn/testing/naive_decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/visit_dtype.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::testing {
namespace {

template <class T>
void naive_rows(const DecodeArgs& a, int threads) {
  const int H = a.num_heads, D = a.head_dim, BS = a.block_size, G = a.group_size();
  const float scale = a.effective_scale();
  const CacheLayout layout = a.cache_layout();  // kv_strides, or the dense layout
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const float cap = a.logits_soft_cap;
  // A row's per-token scale (1 without per-token scales).
  const CacheLayout scale_layout = a.token_scale_layout();
  const auto row_scale = [&](const float* scales, int id, int kv, int slot) {
    return scales != nullptr ? scales[scale_layout.offset(id, kv, slot)] : 1.f;
  };
  // Value d of the row at element offset `row` (int4: a code, times its group's scale `group`).
  constexpr bool kInt4 = std::is_same_v<T, int4x2_t>;
  const auto value = [&](const T* cache, std::int64_t row, int d, const float* group) {
    if constexpr (kInt4) {
      return static_cast<float>(int4_code(&cache->bits, row + d)) * group[d / kInt4GroupSize];
    } else {
      return to_float(cache[row + d]);
    }
  };
  // Each query token's sequence and the context it attends to: with q_indptr, token i of
  // sequence b's n at position P = L_b - n + i is a query of a context of P + 1 tokens, and
  // reads its keys and values itself, as a first implementation would; with a tree mask it
  // skips the new tokens its mask row leaves out.
  const int tokens = a.q_rows();
  std::vector<int> seq_of(tokens), len_of(tokens);
  std::vector<TreeMaskRow> tree_of(tokens);
  for (int b = 0; b < a.batch; ++b) {
    const int first = a.q_indptr ? a.q_indptr[b] : b;
    const int n = a.q_indptr ? a.q_indptr[b + 1] - first : 1;
    for (int i = 0; i < n; ++i) {
      seq_of[first + i] = b;
      len_of[first + i] = std::max(0, a.context_lens[b] - n + i + 1);
      tree_of[first + i] = tree_mask_row(a, b, i);
    }
  }
  const std::int64_t rows = static_cast<std::int64_t>(tokens) * H;

#pragma omp parallel num_threads(threads)
  {
    std::vector<float> q(D), acc(D), s(BS);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t row = 0; row < rows; ++row) {
      const int token = static_cast<int>(row / H), h = static_cast<int>(row % H), kv = h / G;
      const int b = seq_of[token], L = len_of[token];
      const TreeMaskRow& tree = tree_of[token];
      // A quantized cache's codes times their kv head's scales (1 for the other dtypes): K's
      // joins the logit scale, V's the output; a row's own scale (per-token scales) joins its
      // logit and its weight.
      const float k_scale = a.k_scale * (a.k_scales != nullptr ? a.k_scales[kv] : 1.f);
      const float v_scale = a.v_scale * (a.v_scales != nullptr ? a.v_scales[kv] : 1.f);
      for (int d = 0; d < D; ++d) q[d] = load_as_float(a.q, a.q_dtype, row * D + d);
      for (int d = 0; d < D; ++d) acc[d] = 0.f;
      float m = -INFINITY, l = 0.f;
      // The attended tokens [first, L): the whole context, or the window.
      const int first = window_first_token(L, a.window_left);
      const float slope = a.alibi_slopes != nullptr ? a.alibi_slopes[h] : 0.f;
      for (int blk = first / BS; blk < blocks_for(L, BS); ++blk) {
        const int n = valid_in_block(L, BS, blk);
        const int t0 = std::max(first - blk * BS, 0);
        const std::int64_t base = layout.offset(table.block(b, blk), kv, 0);
        float m_new = m;
        for (int t = t0; t < n; ++t) {
          if (!tree.attends(blk * BS + t)) continue;
          const std::int64_t k = base + t * layout.token_stride;
          const int id = table.block(b, blk);
          const float* kg = kInt4 ? a.k_token_scales + scale_layout.offset(id, kv, t) : nullptr;
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += q[d] * value(k_cache, k, d, kg);
          s[t] = dot * scale * k_scale * (kInt4 ? 1.f : row_scale(a.k_token_scales, id, kv, t));
          if (cap > 0.f) s[t] = cap * std::tanh(s[t] / cap);
          s[t] += slope * static_cast<float>(blk * BS + t - (L - 1));
          m_new = std::max(m_new, s[t]);
        }
        if (m_new == -INFINITY) continue;  // every token of the block masked out, none before
        const float alpha = std::exp(m - m_new);
        l *= alpha;
        for (int d = 0; d < D; ++d) acc[d] *= alpha;
        for (int t = t0; t < n; ++t) {
          if (!tree.attends(blk * BS + t)) continue;
          const float p = std::exp(s[t] - m_new);
          l += p;
          const std::int64_t v = base + t * layout.token_stride;
          const int id = table.block(b, blk);
          const float* vg = kInt4 ? a.v_token_scales + scale_layout.offset(id, kv, t) : nullptr;
          const float pv = p * (kInt4 ? 1.f : row_scale(a.v_token_scales, id, kv, t));
          for (int d = 0; d < D; ++d) acc[d] += pv * value(v_cache, v, d, vg);
        }
        m = m_new;
      }
      // A sink joins the denominator only (-inf: none).
      const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
      if (sink > m) {
        const float alpha = std::exp(m - sink);
        l = l * alpha + 1.f;
        for (int d = 0; d < D; ++d) acc[d] *= alpha;
        m = sink;
      } else if (sink > -INFINITY) {
        l += std::exp(sink - m);
      }
      const float inv = l > 0.f ? v_scale / l : 0.f;
      for (int d = 0; d < D; ++d) store_from_float(a.out, a.out_dtype, row * D + d, acc[d] * inv);
      if (a.lse) a.lse[row] = l > 0.f ? m + std::log(l) : -INFINITY;
    }
  }
}

}  // namespace

void naive_decode(const DecodeArgs& args, int threads) {
  detail::visit_storage_type(args.k_dtype, [&](auto kv_type) {
    naive_rows<typename decltype(kv_type)::type>(args, threads);
  });
}

}  // namespace pagedattn::testing
