#include "tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

// The dequantization scales of kv head kv (quantized caches; 1 for others): a code c of K means
// c x k_scale_of(a, kv), of V c x v_scale_of(a, kv).
double k_scale_of(const DecodeArgs& a, int kv) {
  return static_cast<double>(a.k_scale) * (a.k_scales != nullptr ? a.k_scales[kv] : 1.f);
}
double v_scale_of(const DecodeArgs& a, int kv) {
  return static_cast<double>(a.v_scale) * (a.v_scales != nullptr ? a.v_scales[kv] : 1.f);
}

// Row t of sequence b's kv head kv dequantized: K into k (head_dim values), and the largest
// finite |V| (the code times its kv head's scale and, with per-token scales, its row's).
double dequantized_row(const DecodeArgs& a, int b, int t, int kv, double* k) {
  const CacheLayout layout = a.cache_layout();
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const int id = table.block(b, t / a.block_size), slot = t % a.block_size;
  const std::int64_t base = layout.offset(id, kv, slot);
  const double k_head = k_scale_of(a, kv), v_head = v_scale_of(a, kv);
  // A row's own scales: one, or an int4 row's one per group of 32 values.
  const int group = a.head_dim / token_scales_per_row(a.k_dtype, a.head_dim);
  const std::int64_t at =
      a.k_token_scales != nullptr ? a.token_scale_layout().offset(id, kv, slot) : 0;
  double vmax = 0;
  for (int d = 0; d < a.head_dim; ++d) {
    double ks = k_head, vs = v_head;
    if (a.k_token_scales != nullptr) {
      ks *= a.k_token_scales[at + d / group];
      vs *= a.v_token_scales[at + d / group];
    }
    k[d] = load_as_float(a.k_cache, a.k_dtype, base + d) * ks;
    vmax = std::max(vmax, std::fabs(load_as_float(a.v_cache, a.v_dtype, base + d) * vs));
  }
  return vmax;
}

// The rows among [r0, r1) (one sequence's) that attend token t: within their context and window,
// and named by their tree mask.
std::vector<int> rows_attending(const BuiltCase& bc, const DecodeArgs& a, int r0, int r1, int t) {
  std::vector<int> rows;
  for (int r = r0; r < r1; ++r) {
    const int L = bc.row_lens[r];
    if (t < L && t >= window_first_token(L, a.window_left) && bc.tree_attends(r, t)) {
      rows.push_back(r);
    }
  }
  return rows;
}

// The f32 logit error bound of an inexact case: |fl(s_t) - s_t| <= c * u * scale * sum |q_d k_d|
// with c = 2 sqrt(D) + 4 (probabilistic rounding-error growth of a D-term dot product, plus the
// rounding of q * scale and of the logit itself). The soft-cap's derivative, sech^2(s / cap), is
// at most 1 and falls with |s|, so a capped logit's error is at most that bound times sech^2 at
// the point of [s - e, s + e] nearest 0 (mean value theorem): saturated logits keep almost none
// of it. Sets *logit_err to the largest such error over every attended (row, h, t) (with `dots`;
// else leaves it) and *max_abs_v to the largest |V| of the tokens some row attends (each row, a
// query token, attends to its own context, BuiltCase::row_lens, less what its window and tree
// mask leave out). A quantized cache's K and V count dequantized (dequantized_row), and its
// logits take two roundings more: of k_scale x k_scales[h], and of that product folded into the
// logit scale (an int8 cache, which the CPU backend reads as f32 rows, too: it scales q the same
// way); per-token scales one more, the CPU backend's product of each code and its row's scale.
void logit_error_bound(const BuiltCase& bc, const DecodeArgs& a, bool dots, double* logit_err,
                       double* max_abs_v) {
  const int D = a.head_dim, G = a.group_size();
  const double scale = a.effective_scale(), cap = a.logits_soft_cap;
  const double c = (2 * std::sqrt(static_cast<double>(D)) + 4 + (is_quantized(a.k_dtype) ? 2 : 0) +
                    (a.k_token_scales != nullptr ? 1 : 0)) *
                   kU * scale;
  double worst = 0, vmax = 0;
  // q widened once; each K row once per sequence, for every row (query token) that attends it.
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * D;
  std::vector<double> q(static_cast<std::size_t>(bc.rows * row)), k(D);
  for (int r = 0; r < bc.rows && dots; ++r) {
    for (std::int64_t i = 0; i < row; ++i) {
      q[static_cast<std::size_t>(r * row + i)] =
          load_as_float(a.q, a.q_dtype, r * a.q_stride() + i);
    }
  }
  for (int r0 = 0, r1 = 0; r0 < bc.rows; r0 = r1) {
    // Rows r0 .. r1 - 1: one sequence's, their contexts (and windows' first tokens) rising.
    const int b = bc.row_seq[r0];
    while (r1 < bc.rows && bc.row_seq[r1] == b) ++r1;
    const int t_end = bc.row_lens[r1 - 1];
    for (int t = window_first_token(bc.row_lens[r0], a.window_left); t < t_end; ++t) {
      const std::vector<int> rows = rows_attending(bc, a, r0, r1, t);
      if (rows.empty()) continue;  // its poison (NaN, -128, kCheckedUnreadScale) is not read
      for (int kv = 0; kv < a.num_kv_heads; ++kv) {
        vmax = std::max(vmax, dequantized_row(a, b, t, kv, k.data()));
        for (int r : rows) {
          for (int g = 0; g < G && dots; ++g) {
            const double* x = &q[static_cast<std::size_t>(r * row + (kv * G + g) * D)];
            double abs_sum = 0, sum = 0;
            for (int d = 0; d < D; ++d) {
              abs_sum += std::fabs(x[d] * k[d]);
              sum += x[d] * k[d];
            }
            double e = c * abs_sum;
            if (cap > 0) {
              const double sech = 1 / std::cosh(std::max(std::fabs(scale * sum) - e, 0.0) / cap);
              e *= sech * sech;
            }
            worst = std::max(worst, e);
          }
        }
      }
    }
  }
  if (dots) *logit_err = worst;
  *max_abs_v = vmax;
}

bool is_pow2(double x) {
  int exponent = 0;
  return std::frexp(x, &exponent) == 0.5;
}

// Whether every K scale is a power of two: each kv head's k_scale x k_scales[h] and each finite
// per-token K scale (dense: the NaN of the rows nobody reads skipped).
bool pow2_k_scales(const DecodeArgs& a) {
  for (int kv = 0; kv < a.num_kv_heads; ++kv) {
    if (!is_pow2(k_scale_of(a, kv))) return false;
  }
  if (a.k_token_scales == nullptr) return true;
  const std::int64_t n = static_cast<std::int64_t>(a.num_blocks) * a.num_kv_heads * a.block_size;
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = a.k_token_scales[i];
    if (std::isfinite(x) && !is_pow2(x)) return false;
  }
  return true;
}

double max_abs_finite(const void* data, DType t, std::size_t n) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = std::fabs(load_as_float(data, t, i));
    if (std::isfinite(x)) m = std::max(m, x);
  }
  return m;
}

}  // namespace

// `backend`: the CPU backend multiplies q by the scale, exactly when it is a power of two; the
// CUDA backend folds scale * log2(e) into q on its CUDA-core path (an f32 cache, or q in another
// dtype than the cache), which rounds every product, so snapped values give exact logits on the
// CPU only.
Tolerance tolerance_for(const FuzzCase& c, const BuiltCase& bc, const ReferenceResult& ref,
                        Backend backend) {
  // The dense K and V with the default strides: the same values whatever the layout.
  const DecodeArgs a = bc.dense_args();
  Tolerance t;
  const int H = a.num_heads;
  double ref_scale = 1e-30;
  for (double x : ref.out) ref_scale = std::max(ref_scale, std::fabs(x));

  // Per case: the f32 error of the logits themselves. Snapped values times a power-of-two scale
  // give exact logits (on the CPU); anything else at large magnitudes (huge cases, soft-capped
  // ones aimed past their cap, a shrunk case that keeps snapped values with the default scale)
  // adds the f32 error bound of the dot products, which a soft-cap compresses
  // (logit_error_bound).
  //
  // A quantized cache's K scale joins the logit scale (q x scale x k_scale x k_scales[h], in f32):
  // its snapped logits stay exact when every such product is a power of two too (the fuzzer draws
  // them so), and every per-token K scale (a snapped case's are). Its dequantized K need not follow
  // the magnitude (codes that saturate, or flush to the format's coarsest steps, under an extreme
  // scale), so its logits always get the bound.
  double logit_ds = 0, vmax = 0;
  const bool exact_logits =
      backend == Backend::kCpu && c.snap && a.scale && is_pow2(*a.scale) && pow2_k_scales(a);
  if (!exact_logits && (c.spec.magnitude > 2.f || is_quantized(a.k_dtype))) {
    logit_error_bound(bc, a, /*dots=*/true, &t.logit_err, &vmax);
    logit_ds = t.logit_err;
  } else if (a.k_token_scales != nullptr) {
    // The rows no token reads may hold kCheckedUnreadScale: max |V| of the attended ones alone.
    logit_error_bound(bc, a, /*dots=*/false, &t.logit_err, &vmax);
  } else {
    const CacheLayout layout =
        CacheLayout::dense(a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
    double vs = 0;  // the largest V scale of any kv head
    for (int kv = 0; kv < a.num_kv_heads; ++kv) vs = std::max(vs, v_scale_of(a, kv));
    vmax = vs * max_abs_finite(a.v_cache, a.v_dtype, static_cast<std::size_t>(layout.elements()));
  }
  // The soft-cap's own evaluation: at most a few ulp of the cap, whatever the logit, in either
  // backend's form (cap * tanh(s / cap) with a vector tanh; cap - 2 cap / (exp2(2 s2 / cap2) + 1)
  // in log2 units with a 2^-22 exp2, about 6 u cap in all: the quotient, the exp2, the argument's
  // roundings, which tanh' <= 1 damps, and the final difference). Taken as 12 u cap. A capped
  // logit's incoming error is the raw one, not magnified (the derivative is at most 1).
  if (a.logits_soft_cap > 0) logit_ds += 12 * kU * a.logits_soft_cap;

  // The tolerance policy (testing/tolerance.hpp) covers f32 arithmetic and the output rounding.
  // An absolute floor covers outputs near 0, which a sink that outweighs every token makes (the
  // policy's bound is relative to the output scale): each f32 weight or weighted value below
  // 2^-126 may be flushed to 0 (ex2.approx.ftz on CUDA), at most 2^-126 max|V| per token and as
  // much again for its product with V (the sum is divided by l >= 1); and the output dtype's
  // smallest subnormal step bounds the final rounding there (2^-24 for f16).
  int max_len = 0;
  for (int L : bc.row_lens) max_len = std::max(max_len, L);
  const double subnormal_step = a.out_dtype == DType::kF16    ? 0x1p-24
                                : a.out_dtype == DType::kBF16 ? 0x1p-133
                                                              : 0x1p-149;
  const double out_base = testing::out_tolerance(a.out_dtype) * ref_scale +
                          2 * (max_len + 1) * 0x1p-126 * std::max(vmax, 1.0) + subnormal_step;

  t.out_abs.assign(ref.lse.size(), out_base);
  t.lse_abs.assign(ref.lse.size(), testing::lse_tolerance());
  for (int r = 0; r < bc.rows; ++r) {
    // Each row's own context (a query token at position P attends to P + 1 tokens). An empty
    // context has out = 0 and lse = the sink, which a backend may round through log2 units like
    // any other logit (no tokens, so nothing else).
    const int L = bc.row_lens[r];
    const int attended = L - window_first_token(L, a.window_left);
    for (int h = 0; h < H; ++h) {
      const std::size_t row = static_cast<std::size_t>(r) * H + h;
      const double lse = ref.lse[row];
      if (!std::isfinite(lse)) continue;  // a NaN or Inf input: only the finite check applies
      // Even exact logits reach exp() through f32 arguments: a backend may form s * log2(e) - m *
      // log2(e) (or s - m after a scaled dot), each rounded at |s| u, so every weight carries a
      // relative error up to about 8 u |m|, with |m| <= |lse| + ln(n) over the n terms of the
      // softmax (a sink is one more, which the same rounding reaches).
      double ds = 8 * kU * (std::fabs(lse) + std::log1p(attended + (a.sinks ? 1.0 : 0.0)));
      ds += logit_ds;
      // An ALiBi bias slope * (t - (L - 1)) is exact up to f32 rounding: of the slope (converted
      // to log2 units on CUDA), of the product with the integer distance, and of the sum with
      // the logit, each at most u |bias|; taken as 4 u max|bias| over the row's tokens.
      if (a.alibi_slopes != nullptr) {
        ds +=
            4 * kU * std::fabs(static_cast<double>(a.alibi_slopes[h])) * std::max(attended - 1, 0);
      }
      // A logit error ds moves every normalized softmax weight by at most a factor
      // exp(+-2 ds); the tokens' weights sum to their share of the softmax (1 - the sink's,
      // which the reference computes from the tokens' own weights: 1 - exp(sink - lse) would
      // round to 0 where the sink takes all but 1e-16 of it, and with it the bound, while out
      // is tokens_share x V, far above the absolute floor), so out moves by at most
      // (exp(2 ds) - 1) tokens_share max|V|, and by at most 2 max|V| whatever ds (|out| <=
      // max|V| on both sides); lse moves by ds.
      const double tokens_share = ref.tokens_share[row];
      if (tokens_share > 0) {
        t.out_abs[row] += std::min(std::expm1(2 * ds) * tokens_share, 2.0) * vmax;
      }
      // lse is stored in f32, whose own rounding at |lse| ~ 1e4 (half an ulp, u |lse|) exceeds the
      // policy's fixed part.
      t.lse_abs[row] += 4 * kU * std::fabs(lse) + ds;
    }
  }
  return t;
}

}  // namespace pagedattn::fuzz
