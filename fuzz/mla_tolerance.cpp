// The tolerance policy for MLA decode: the output dtype's rounding (testing/tolerance.hpp) plus
// what the f32 error of the logits, sums of kv_lora_rank + rope_dim products, does to the softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

// Per sequence and token t: the largest Euclidean norm of a latent row (c and k_pe) among tokens
// 0..t, and the largest |c| among them, dequantized.
struct LatentBounds {
  std::vector<std::vector<double>> norm, vmax;  // [batch][tokens]
};

LatentBounds latent_bounds(const MlaDecodeArgs& a) {
  LatentBounds lb;
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const MlaPartStrides cl = a.c_layout(), pl = a.kpe_layout();
  const double s = a.kv_scale;
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    std::vector<double> norm(static_cast<std::size_t>(L)), vmax(static_cast<std::size_t>(L));
    double n_most = 0, v_most = 0;
    for (int t = 0; t < L; ++t) {
      const std::int64_t id = table.block(b, t / a.block_size), slot = t % a.block_size;
      double sq = 0;
      for (int d = 0; d < a.kv_lora_rank; ++d) {
        const double x = load_as_float(a.c_cache, a.kv_dtype, id * cl.block + slot * cl.token + d);
        sq += x * x * s * s;
        v_most = std::max(v_most, std::fabs(x * s));
      }
      for (int d = 0; d < a.rope_dim; ++d) {
        const double x =
            load_as_float(a.kpe_cache, a.kv_dtype, id * pl.block + slot * pl.token + d);
        sq += x * x * s * s;
      }
      n_most = std::max(n_most, std::sqrt(sq));
      norm[static_cast<std::size_t>(t)] = n_most;
      vmax[static_cast<std::size_t>(t)] = v_most;
    }
    lb.norm.push_back(std::move(norm));
    lb.vmax.push_back(std::move(vmax));
  }
  return lb;
}

// The Euclidean norm of query row r's head h (q_nope and q_pe together).
double q_norm(const MlaDecodeArgs& a, int r, int h) {
  double sq = 0;
  for (int d = 0; d < a.kv_lora_rank; ++d) {
    const double x =
        load_as_float(a.q_nope, a.q_dtype, r * a.q_nope_row() + h * a.q_nope_head() + d);
    sq += x * x;
  }
  for (int d = 0; d < a.rope_dim; ++d) {
    const double x = load_as_float(a.q_pe, a.q_dtype, r * a.q_pe_row() + h * a.q_pe_head() + d);
    sq += x * x;
  }
  return std::sqrt(sq);
}

}  // namespace

// Each logit is a D-term f32 dot product (D = kv_lora_rank + rope_dim) of q scaled in f32 (an
// fp8 cache's kv_scale folded in: two roundings more): |fl(s_t) - s_t| <= c u scale sum |q_d k_d|
// with c = 2 sqrt(D) + 4 (+ 2), as for GQA (tolerance.cpp), and sum |q_d k_d| <= |q| |k|
// (Cauchy-Schwarz), with |k| the largest latent row norm among the row's tokens. A logit error
// ds moves the softmax weights by a factor exp(+-2 ds), so out by (exp(2 ds) - 1) max|c| and lse
// by ds; exp() itself sees f32 arguments near |lse| + ln(L), 8 u of those.
Tolerance mla_tolerance_for(const MlaDecodeArgs& a, const ReferenceResult& ref) {
  Tolerance t;
  const int H = a.num_heads, D = a.kv_lora_rank + a.rope_dim;
  double ref_scale = 1e-30;
  for (double x : ref.out) {
    if (std::isfinite(x)) ref_scale = std::max(ref_scale, std::fabs(x));
  }
  const double c = (2 * std::sqrt(static_cast<double>(D)) + 4 + (is_fp8(a.kv_dtype) ? 2 : 0)) * kU *
                   a.effective_scale();
  const double subnormal_step = a.out_dtype == DType::kF16    ? 0x1p-24
                                : a.out_dtype == DType::kBF16 ? 0x1p-133
                                                              : 0x1p-149;
  const LatentBounds lb = latent_bounds(a);
  t.out_abs.assign(ref.lse.size(), 0);
  t.lse_abs.assign(ref.lse.size(), testing::lse_tolerance());
  for (int b = 0; b < a.batch; ++b) {
    const int row0 = a.q_indptr ? a.q_indptr[b] : b;
    const int n = a.q_indptr ? a.q_indptr[b + 1] - row0 : 1;
    for (int i = 0; i < n; ++i) {
      const int r = row0 + i;
      const int L = std::max(0, a.context_lens[b] - n + i + 1);
      const double knorm = L ? lb.norm[b][L - 1] : 0, vmax = L ? lb.vmax[b][L - 1] : 0;
      for (int h = 0; h < H; ++h) {
        const std::size_t at = static_cast<std::size_t>(r) * H + h;
        const double floor = 2 * (L + 1) * 0x1p-126 * std::max(vmax, 1.0) + subnormal_step;
        t.out_abs[at] = testing::out_tolerance(a.out_dtype) * ref_scale + floor;
        const double lse = ref.lse[at];
        if (!std::isfinite(lse)) continue;
        const double ds = c * q_norm(a, r, h) * knorm + 8 * kU * (std::fabs(lse) + std::log1p(L));
        t.logit_err = std::max(t.logit_err, ds);
        t.out_abs[at] += std::min(std::expm1(2 * ds), 2.0) * vmax;
        t.lse_abs[at] += 4 * kU * std::fabs(lse) + ds;
      }
    }
  }
  return t;
}

}  // namespace pagedattn::fuzz
