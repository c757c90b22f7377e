#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fault_injection.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cp_shares.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

// Outputs of one run, widened to double.
struct Result {
  std::vector<double> out, lse;
};

// The `rows` rows of `out` (rows of `stride` elements), dense, and lse.
Result read_outputs(const testing::HostCase& h, int rows, const std::vector<std::uint8_t>& out,
                    std::int64_t stride, const std::vector<float>& lse) {
  Result r;
  const DType t = h.spec.out_dtype;
  const std::int64_t row = static_cast<std::int64_t>(h.spec.num_heads) * h.spec.head_dim;
  r.out.resize(static_cast<std::size_t>(rows * row));
  for (int b = 0; b < rows; ++b) {
    for (std::int64_t i = 0; i < row; ++i) {
      r.out[static_cast<std::size_t>(b * row + i)] = load_as_float(out.data(), t, b * stride + i);
    }
  }
  r.lse.assign(lse.begin(), lse.begin() + static_cast<std::ptrdiff_t>(rows) * h.spec.num_heads);
  return r;
}

Result read_outputs(const BuiltCase& bc) {
  return read_outputs(bc.host, bc.rows, bc.out_buffer(), bc.out_stride, bc.host.lse);
}

// Row r of q, out and lse, for messages: its sequence, and with multi-token queries which of the
// sequence's query tokens it is and the context it attends.
std::string row_text(const BuiltCase& bc, std::size_t r) {
  if (bc.q_indptr.empty() || r >= bc.row_seq.size()) return {};
  const int b = bc.row_seq[r];
  std::ostringstream os;
  os << " (sequence " << b << "'s query token " << static_cast<int>(r) - bc.q_indptr[b] << " of "
     << bc.q_indptr[b + 1] - bc.q_indptr[b] << ", context " << bc.row_lens[r] << " of "
     << bc.host.context_lens[b] << ")";
  return os.str();
}

// Every byte of out's gaps (after each row of a strided out) still kOutGapByte: no backend may
// write there. Empty when so.
std::string check_gaps(const testing::HostCase& h, int rows, const std::vector<std::uint8_t>& out,
                       std::int64_t stride) {
  const std::size_t osz = dtype_size(h.spec.out_dtype);
  const std::int64_t row = static_cast<std::int64_t>(h.spec.num_heads) * h.spec.head_dim;
  if (stride == row) return {};
  for (int b = 0; b < rows; ++b) {
    for (std::int64_t i = row; i < stride; ++i) {
      const std::size_t at = static_cast<std::size_t>(b * stride + i) * osz;
      if (std::any_of(out.begin() + static_cast<std::ptrdiff_t>(at),
                      out.begin() + static_cast<std::ptrdiff_t>(at + osz),
                      [](std::uint8_t x) { return x != kOutGapByte; })) {
        std::ostringstream os;
        os << "out gap element " << i - row << " after row " << b << " (element " << b * stride + i
           << " of out, row stride " << stride
           << ") written: " << load_as_float(out.data(), h.spec.out_dtype, b * stride + i);
        return os.str();
      }
    }
  }
  return {};
}

std::string check_gaps(const BuiltCase& bc) {
  if (bc.rows == 0 && bc.host.spec.batch > 0) {
    // No query tokens: the row q and out hold (not to be null) is no output, and lse has none.
    const std::uint8_t poison = bc.out_rows.empty() ? 0xff : kOutGapByte;
    const std::vector<std::uint8_t>& out = bc.out_buffer();
    if (std::any_of(out.begin(), out.end(), [&](std::uint8_t x) { return x != poison; }) ||
        !std::all_of(bc.host.lse.begin(), bc.host.lse.end(),
                     [](float x) { return std::isnan(x); })) {
      return "out or lse written by a call without query tokens";
    }
    return {};
  }
  return bc.out_rows.empty() ? std::string()
                             : check_gaps(bc.host, bc.rows, bc.out_rows, bc.out_stride);
}

// The CUDA backend over device copies of a host case (the slopes, sinks and q_indptr included),
// out and lse copied back. DeviceCase checks the shapes itself, so it is given the case without
// its window, soft-cap, row strides, multi-token queries and cache layout, which are put back for
// the backend: on a malformed one the error must be the backend's. DeviceCase copies dense
// caches, so a laid-out case gives it the dense K and V and its own layout's buffers (gaps and
// all) get device copies of their own, which the backend reads through the case's kv_strides.
// DeviceCase copies batch rows of q, out and lse, so a strided q or out, and with multi-token
// queries (or a declared row count that is not the buffers': a malformed one) q, out and lse, get
// device copies of their whole buffers here, gaps included (q's NaN, out's kOutGapByte), and come
// back whole, so that a read or write of a gap shows on the host; DeviceCase then copies a stand-in
// of batch rows instead.
void run_cuda(const BuiltCase& bc, const DecodeArgs& host, const detail::DecodeOptions& o) {
  DecodeArgs plain = host;
  plain.window_left = -1;
  plain.logits_soft_cap = 0.f;
  plain.q_row_stride = 0;
  plain.out_row_stride = 0;
  plain.q_indptr = nullptr;
  plain.num_q_tokens = 0;
  plain.max_q_len = 0;
  plain.kv_strides = CacheStrides{};
  const bool own_kv = bc.laid_out();
  if (own_kv) {
    if (plain.k_cache != nullptr) plain.k_cache = bc.host.k.data();
    if (plain.v_cache != nullptr) plain.v_cache = bc.host.v.data();
  }
  const bool other_rows = !bc.q_indptr.empty() || bc.rows != host.batch;
  const bool own_q =
      host.q != nullptr && host.q == bc.q_buffer().data() && (!bc.q_rows.empty() || other_rows);
  const bool own_out = host.out != nullptr && host.out == bc.out_buffer().data() &&
                       (!bc.out_rows.empty() || other_rows);
  const bool own_lse = host.lse != nullptr && other_rows;
  std::vector<std::uint8_t> stand_in;
  if (own_q || own_out) {
    // The error DeviceCase would raise, before the stand-in is sized by the shapes.
    validate_shapes(plain);
    stand_in.assign(static_cast<std::size_t>(std::max(host.batch, 0)) * host.num_heads *
                        host.head_dim * sizeof(float),
                    0);
    if (own_q) plain.q = stand_in.data();
    if (own_out) plain.out = stand_in.data();
  }
  if (own_lse) plain.lse = nullptr;
  const testing::DeviceCase dev(plain, o.cuda_stream);
  DecodeArgs d = dev.args();
  d.window_left = host.window_left;
  d.logits_soft_cap = host.logits_soft_cap;
  d.q_row_stride = host.q_row_stride;
  d.out_row_stride = host.out_row_stride;
  d.num_q_tokens = host.num_q_tokens;
  d.max_q_len = host.max_q_len;
  testing::DeviceBuffer dq, dout, dlse, dindptr, dk, dv;
  if (own_kv) {
    // The storage's pointers and strides on device copies, then the arguments' own strides
    // (a malformed one) and null pointers back.
    dk = testing::DeviceBuffer(bc.kv.k.data(), bc.kv.k.size());
    if (!bc.kv.v.empty()) dv = testing::DeviceBuffer(bc.kv.v.data(), bc.kv.v.size());
    bc.kv.apply(d, dk.get(), dv.get());
    if (host.k_cache == nullptr) d.k_cache = nullptr;
    if (host.v_cache == nullptr) d.v_cache = nullptr;
  }
  d.kv_strides = host.kv_strides;
  if (own_q) {
    dq = testing::DeviceBuffer(bc.q_buffer().data(), bc.q_buffer().size());
    d.q = dq.get();
  }
  if (own_out) {
    dout = testing::DeviceBuffer(bc.out_buffer().data(), bc.out_buffer().size());
    d.out = dout.get();
  }
  if (own_lse) {
    dlse = testing::DeviceBuffer(bc.host.lse.data(), bc.host.lse.size() * sizeof(float));
    d.lse = dlse.as<float>();
  }
  if (host.q_indptr != nullptr) {
    // Like the block table: the CUDA backend reads it in device memory.
    dindptr = testing::DeviceBuffer(host.q_indptr, bc.q_indptr.size() * sizeof(std::int32_t));
    d.q_indptr = dindptr.as<const std::int32_t>();
  }
  detail::decode(d, o);
  if (!own_out) {
    dev.download(host, o.cuda_stream);  // out, and lse unless it has its own copy
  } else {
    testing::device_synchronize();
    testing::copy_to_host(host.out, dout.get(), bc.out_buffer().size());
    if (!own_lse && host.lse != nullptr && host.batch > 0) {
      testing::copy_to_host(host.lse, d.lse,
                            static_cast<std::size_t>(host.batch) * host.num_heads * sizeof(float));
    }
  }
  if (own_lse) {
    testing::device_synchronize();
    testing::copy_to_host(host.lse, dlse.get(), bc.host.lse.size() * sizeof(float));
  }
}

// `checked`: the CUDA backend validates its device-resident tables and variant values (the CPU
// path always does).
void run_backend(Backend backend, const BuiltCase& bc, int threads, bool single_split,
                 bool checked) {
  detail::DecodeOptions o;
  o.backend = backend;
  o.num_threads = threads;
  o.single_split = single_split;
  o.cuda_checked = checked;
  if (backend == Backend::kCuda) {
    run_cuda(bc, bc.args, o);
  } else {
    decode_with_planted_fault(bc.args, o);
  }
}

std::string where(const BuiltCase& bc, std::size_t i, int H, int D) {
  std::ostringstream os;
  os << "out[" << i / D / H << "][" << (i / D) % H << "][" << i % D << "]"
     << row_text(bc, i / D / H);
  return os.str();
}

// The dequantization scales of kv head kv (fp8 caches; 1 for others): a code c of K means
// c x k_scale_of(a, kv), of V c x v_scale_of(a, kv).
double k_scale_of(const DecodeArgs& a, int kv) {
  return static_cast<double>(a.k_scale) * (a.k_scales != nullptr ? a.k_scales[kv] : 1.f);
}
double v_scale_of(const DecodeArgs& a, int kv) {
  return static_cast<double>(a.v_scale) * (a.v_scales != nullptr ? a.v_scales[kv] : 1.f);
}

// The f32 logit error bound of an inexact case: |fl(s_t) - s_t| <= c * u * scale * sum |q_d k_d|
// with c = 2 sqrt(D) + 4 (probabilistic rounding-error growth of a D-term dot product, plus the
// rounding of q * scale and of the logit itself). The soft-cap's derivative, sech^2(s / cap), is
// at most 1 and falls with |s|, so a capped logit's error is at most that bound times sech^2 at
// the point of [s - e, s + e] nearest 0 (mean value theorem): saturated logits keep almost none
// of it. Returns the largest such error over every attended (row, h, t) and the largest |V| read
// (each row, a query token, attends to its own context: BuiltCase::row_lens). An fp8 cache's K and
// V count dequantized (the code times its kv head's scale), and its logits take two roundings
// more: of k_scale x k_scales[h], and of that product folded into the logit scale.
void logit_error_bound(const BuiltCase& bc, const DecodeArgs& a, double* logit_err,
                       double* max_abs_v) {
  const CacheLayout layout =
      CacheLayout::dense(a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const int D = a.head_dim, G = a.group_size();
  const double scale = a.effective_scale(), cap = a.logits_soft_cap;
  const double c =
      (2 * std::sqrt(static_cast<double>(D)) + 4 + (is_fp8(a.k_dtype) ? 2 : 0)) * kU * scale;
  double worst = 0, vmax = 0;
  // q widened once; each K row once per sequence, for every row (query token) that attends it.
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * D;
  std::vector<double> q(static_cast<std::size_t>(bc.rows * row)), k(D);
  for (int r = 0; r < bc.rows; ++r) {
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
      for (int kv = 0; kv < a.num_kv_heads; ++kv) {
        const std::int64_t base =
            layout.offset(table.block(b, t / a.block_size), kv, t % a.block_size);
        const double ks = k_scale_of(a, kv), vs = v_scale_of(a, kv);
        for (int d = 0; d < D; ++d) {
          k[d] = load_as_float(a.k_cache, a.k_dtype, base + d) * ks;
          vmax = std::max(vmax, std::fabs(load_as_float(a.v_cache, a.v_dtype, base + d) * vs));
        }
        for (int r = r0; r < r1; ++r) {
          const int L = bc.row_lens[r];
          if (t >= L || t < window_first_token(L, a.window_left)) continue;
          for (int g = 0; g < G; ++g) {
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
  *logit_err = worst;
  *max_abs_v = vmax;
}

double max_abs_finite(const void* data, DType t, std::size_t n) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = std::fabs(load_as_float(data, t, i));
    if (std::isfinite(x)) m = std::max(m, x);
  }
  return m;
}

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
  // An fp8 cache's K scale joins the logit scale (q x scale x k_scale x k_scales[h], in f32): its
  // snapped logits stay exact when every such product is a power of two too (the fuzzer draws
  // them so). Its dequantized K need not follow the magnitude (codes that saturate, or flush to
  // the format's coarsest steps, under an extreme scale), so its logits always get the bound.
  double logit_ds = 0, vmax = 0;
  int exponent = 0;
  bool pow2_k_scales = true;
  for (int kv = 0; kv < a.num_kv_heads; ++kv) {
    pow2_k_scales = pow2_k_scales && std::frexp(k_scale_of(a, kv), &exponent) == 0.5;
  }
  const bool exact_logits = backend == Backend::kCpu && c.snap && a.scale &&
                            std::frexp(*a.scale, &exponent) == 0.5f && pow2_k_scales;
  if (!exact_logits && (c.spec.magnitude > 2.f || is_fp8(a.k_dtype))) {
    logit_error_bound(bc, a, &t.logit_err, &vmax);
    logit_ds = t.logit_err;
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

// Compares `got` with `want` (the reference or another run). Returns an empty string when they
// agree; `ratio` gets the worst error / tolerance.
std::string compare(const BuiltCase& bc, const Result& got, const std::vector<double>& want_out,
                    const std::vector<double>& want_lse, const Tolerance& tol, double* ratio) {
  const int H = bc.args.num_heads, D = bc.args.head_dim;
  // Row by row ((row, head): one bound each), the first element out of bounds reported.
  for (std::size_t j = 0; j * D < want_out.size(); ++j) {
    const double bound = tol.out_abs[j];
    const double *g = &got.out[j * D], *w = &want_out[j * D];
    double row_err = 0;
    bool bad = false;
    for (int d = 0; d < D; ++d) {
      const double err = std::fabs(g[d] - w[d]);
      row_err = std::max(row_err, err);
      bad |= !(err <= bound);
    }
    *ratio = std::max(*ratio, row_err / bound);
    for (int d = 0; bad && d < D; ++d) {
      const double err = std::fabs(g[d] - w[d]);
      if (err <= bound) continue;
      std::ostringstream os;
      os << where(bc, j * D + d, H, D) << " = " << g[d] << ", expected " << w[d] << " (|err| "
         << err << " > tol " << bound << ")";
      return os.str();
    }
  }
  for (std::size_t i = 0; i < want_lse.size(); ++i) {
    const double g = got.lse[i], w = want_lse[i];
    bool ok;
    if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else {
      const double err = std::fabs(g - w);
      *ratio = std::max(*ratio, err / tol.lse_abs[i]);
      ok = err <= tol.lse_abs[i];
    }
    if (!ok) {
      std::ostringstream os;
      os << "lse[" << i / H << "][" << i % H << "]" << row_text(bc, i / H) << " = " << g
         << ", expected " << w << " (tol " << tol.lse_abs[i] << ")";
      return os.str();
    }
  }
  return {};
}

// Every element written and finite (outputs were poisoned with NaN before the run), except an
// empty context's lse (a row's own: a query token at a position below 0 attends to nothing):
// exactly -inf without a sink (or with one of -inf), else finite (the reference check holds it
// to the sink; a backend in log2 units may round it on the way).
std::string check_finite(const Result& r, const BuiltCase& bc, const float* sinks) {
  const int H = bc.host.spec.num_heads, D = bc.host.spec.head_dim;
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    if (!std::isfinite(r.out[i])) {
      std::ostringstream os;
      os << where(bc, i, H, D) << " = " << r.out[i] << " (unwritten or not finite)";
      return os.str();
    }
  }
  for (std::size_t i = 0; i < r.lse.size(); ++i) {
    const bool empty = bc.row_lens[i / H] == 0;
    const double x = r.lse[i];
    const bool no_sink = sinks == nullptr || sinks[i % H] == -INFINITY;
    if (empty && no_sink ? !(std::isinf(x) && x < 0) : !std::isfinite(x)) {
      std::ostringstream os;
      os << "lse[" << i / H << "][" << i % H << "]" << row_text(bc, i / H) << " = " << x
         << (!empty    ? " (unwritten or not finite)"
             : no_sink ? " (expected -inf: empty context, no sink)"
                       : " (expected the sink: empty context)");
      return os.str();
    }
  }
  return {};
}

// What every rank of one context-parallel call ended with.
struct RankRuns {
  std::vector<std::vector<std::uint8_t>> outs;
  std::vector<std::vector<float>> lses;
  std::vector<std::string> errors;
  std::vector<ErrorCode> codes;
  std::vector<std::string> arguments;
};

// One context_parallel_decode per rank of a fresh in-process group, each on its share and its own
// copy of `out` (and of NaN lse), on one thread.
RankRuns run_ranks(const DecodeArgs& a, const std::vector<testing::RankShare>& shares,
                   const std::vector<std::uint8_t>& out, std::size_t lse_size) {
  const int ranks = static_cast<int>(shares.size());
  RankRuns runs;
  runs.outs.assign(ranks, out);
  runs.lses.assign(ranks, std::vector<float>(lse_size, NAN));
  runs.errors.resize(ranks);
  runs.codes.assign(ranks, ErrorCode::kInvalidArgument);
  runs.arguments.resize(ranks);
  auto group = make_local_group(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      DecodeArgs mine = a;
      mine.block_table = shares[r].table.data();
      mine.context_lens = shares[r].lens.data();
      mine.out = runs.outs[r].data();
      mine.lse = a.lse != nullptr ? runs.lses[r].data() : nullptr;
      DecodeOptions o;
      o.backend = Backend::kCpu;
      o.num_threads = 1;
      try {
        context_parallel_decode(mine, *group[r], o);
      } catch (const Error& e) {
        runs.errors[r] = e.what();
        runs.codes[r] = e.code();
        runs.arguments[r] = e.argument();
      } catch (const std::exception& e) {
        runs.errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// Context parallelism, on the CPU backend when it is tested: the blocks of every sequence shared
// out among 2 or 3 ranks of the in-process group at random cut points (some ranks holding none),
// each rank decoding its share with context_parallel_decode on one thread; every rank must get
// the same bits, and they must pass the finite and reference checks of a plain run. A strided q
// is read as decode reads it. A case with a window, ALiBi slopes, sinks, multi-token queries
// (q_indptr) or a strided out must be refused instead, on every rank alike (kUnsupported naming
// the first of those fields that is set, out, its gaps and lse untouched); a soft-capped one
// runs. A case refused for its strided out alone runs again with a dense out, so its q is decoded
// too.
std::string check_context_parallel(const FuzzCase& c, BuiltCase& bc, const ReferenceResult& ref,
                                   const Tolerance& tol, double* worst_ratio,
                                   const CheckOptions& options) {
  const DecodeArgs& a = bc.args;
  testing::HostCase& h = bc.host;
  if (a.batch == 0 || std::find(options.backends.begin(), options.backends.end(), Backend::kCpu) ==
                          options.backends.end()) {
    return {};
  }
  const int ranks = 2 + static_cast<int>((c.spec.seed >> 11) & 1);
  std::mt19937 rng(static_cast<std::uint32_t>(c.spec.seed * 2654435761u + 17));
  const std::vector<testing::RankShare> shares =
      testing::share_out(h, ranks, testing::Share::kRanges, rng);
  const std::string tag = std::to_string(ranks) + " ranks: ";
  const char* refused = a.window_left >= 0          ? "window_left"
                        : a.alibi_slopes != nullptr ? "alibi_slopes"
                        : a.sinks != nullptr        ? "sinks"
                        : a.q_indptr != nullptr     ? "q_indptr"
                        : a.out_row_stride != 0     ? "out_row_stride"
                                                    : nullptr;
  if (refused != nullptr) {
    // Poisoned like a plain run's outputs, gaps holding kOutGapByte: all of it must stay.
    bc.poison_outputs();
    const RankRuns runs = run_ranks(a, shares, bc.out_buffer(), h.lse.size());
    const std::string want =
        std::string(error_code_name(ErrorCode::kUnsupported)) + " on '" + refused + "'";
    for (int r = 0; r < ranks; ++r) {
      const std::string rank = tag + "rank " + std::to_string(r) + " ";
      if (runs.codes[r] != ErrorCode::kUnsupported || runs.arguments[r] != refused) {
        return rank + (runs.errors[r].empty() ? "accepted the case" : "threw: " + runs.errors[r]) +
               ", expected " + want;
      }
      if (runs.outs[r] != bc.out_buffer() || !std::all_of(runs.lses[r].begin(), runs.lses[r].end(),
                                                          [](float x) { return std::isnan(x); })) {
        return rank + "wrote out, its gaps or lse before refusing the case";
      }
    }
    if (c.position_variants() || c.multi_token()) return {};
  }
  // Poisoned (all-ones bytes are NaN in every dtype), so that an unwritten element shows.
  DecodeArgs dense_out = a;
  dense_out.out_row_stride = 0;
  const RankRuns runs =
      run_ranks(dense_out, shares, std::vector<std::uint8_t>(h.out.size(), 0xff), h.lse.size());
  for (int r = 0; r < ranks; ++r) {
    if (!runs.errors[r].empty()) {
      return tag + "rank " + std::to_string(r) + " threw: " + runs.errors[r];
    }
  }
  for (int r = 1; r < ranks; ++r) {
    if (runs.outs[r] != runs.outs[0] || std::memcmp(runs.lses[r].data(), runs.lses[0].data(),
                                                    runs.lses[0].size() * sizeof(float)) != 0) {
      return tag + "rank " + std::to_string(r) + " got other bits than rank 0";
    }
  }
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * a.head_dim;
  const Result got = read_outputs(h, bc.rows, runs.outs[0], row, runs.lses[0]);
  if (std::string bad = check_finite(got, bc, a.sinks); !bad.empty()) return tag + bad;
  const std::string bad = compare(bc, got, ref.out, ref.lse, tol, worst_ratio);
  return bad.empty() ? bad : tag + bad;
}

// The reference over the case's laid-out K and V (NaN in every gap) against `dense`, the one over
// the dense cache: the same rows read in the same order, so the same bits. Empty when so.
std::string check_layout_reference(const BuiltCase& bc, const ReferenceResult& dense) {
  ReferenceResult laid;
  try {
    laid = reference_decode(bc.args);
  } catch (const std::exception& e) {
    return std::string("the reference rejected the laid-out cache: ") + e.what();
  }
  const auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
  const int H = bc.args.num_heads, D = bc.args.head_dim;
  for (std::size_t i = 0; i < dense.out.size(); ++i) {
    if (i >= laid.out.size() || !same(laid.out[i], dense.out[i])) {
      std::ostringstream os;
      os << "reference over the " << testing::kv_layout_name(bc.kv.layout)
         << " cache: " << where(bc, i, H, D) << " = " << (i < laid.out.size() ? laid.out[i] : NAN)
         << ", over the dense one " << dense.out[i];
      return os.str();
    }
  }
  for (std::size_t i = 0; i < dense.lse.size(); ++i) {
    if (i >= laid.lse.size() || !same(laid.lse[i], dense.lse[i])) {
      std::ostringstream os;
      os << "reference over the " << testing::kv_layout_name(bc.kv.layout) << " cache: lse["
         << i / H << "][" << i % H << "]" << row_text(bc, i / H) << " = "
         << (i < laid.lse.size() ? laid.lse[i] : NAN) << ", over the dense one " << dense.lse[i];
      return os.str();
    }
  }
  return {};
}

Outcome fail(const std::string& oracle, const std::string& message) {
  Outcome o;
  o.verdict = Verdict::kFail;
  o.oracle = oracle;
  o.message = message;
  return o;
}

// Expects `backend` to raise `code` on `argument`, leaving out (its gaps included) and lse as they
// were: a passing outcome when it does, else the failing oracle's. `what` names the input.
Outcome expect_error(Backend backend, BuiltCase& bc, int threads, bool checked, ErrorCode code,
                     const std::string& argument, const std::string& what) {
  testing::HostCase& h = bc.host;
  const std::string tag = std::string(backend_name(backend)) + ": ";
  const std::string want = std::string(error_code_name(code)) + " on '" + argument + "'";
  bc.poison_outputs();
  const std::vector<std::uint8_t> out_before = bc.out_buffer();
  const std::vector<float> lse_before = h.lse;
  try {
    run_backend(backend, bc, threads, false, checked);
    return fail("error", tag + "accepted " + what + ", expected " + want);
  } catch (const Error& e) {
    if (e.code() != code || e.argument() != argument) {
      return fail("error", tag + "raised " + error_code_name(e.code()) + " on '" + e.argument() +
                               "' (" + e.what() + "), expected " + want);
    }
  } catch (const std::exception& e) {
    return fail("error", tag + "threw a non-pagedattn exception: " + e.what());
  }
  if (bc.out_buffer() != out_before ||
      std::memcmp(h.lse.data(), lse_before.data(), h.lse.size() * sizeof(float)) != 0) {
    return fail("untouched", tag + "wrote out or lse before rejecting the input");
  }
  return {};
}

Outcome check_malformed(BuiltCase& bc, const CheckOptions& options, int threads) {
  for (Backend backend : options.backends) {
    // The CUDA backend may refuse a misaligned row stride first (BuiltCase::cuda_refuses).
    const bool cuda_first = backend == Backend::kCuda && !bc.cuda_refuses.empty();
    Outcome o = expect_error(backend, bc, threads, /*checked=*/true,
                             cuda_first ? ErrorCode::kInvalidArgument : bc.expected_code,
                             cuda_first ? bc.cuda_refuses : bc.expected_argument, "invalid input");
    if (o.failed()) return o;
  }
  return {};
}

}  // namespace

Outcome check_case(const FuzzCase& c, const CheckOptions& options) {
  BuiltCase bc;
  try {
    bc = build_case(c);
  } catch (const std::invalid_argument& e) {
    Outcome o;
    o.verdict = Verdict::kInapplicable;
    o.message = e.what();
    return o;
  }
  const int threads = options.threads > 0 ? options.threads : c.threads;
  if (c.malformed()) return check_malformed(bc, options, threads);

  testing::HostCase& h = bc.host;
  const DecodeArgs& a = bc.args;
  // The reference over the dense K and V, which the layout only moves: whatever the backends do
  // with kv_strides, they are held to the same attention.
  ReferenceResult ref;
  try {
    ref = reference_decode(bc.dense_args());
  } catch (const std::exception& e) {
    return fail("reference", std::string("the reference rejected a valid case: ") + e.what());
  }
  if (bc.laid_out()) {
    // The reference reads kv_strides too: over the laid-out cache it must give the same bits.
    if (std::string bad = check_layout_reference(bc, ref); !bad.empty()) {
      return fail("layout", bad);
    }
  }
  // The CPU's bounds, and the CUDA backend's where it runs (no tighter, see tolerance_for).
  const Tolerance cpu_tol = tolerance_for(c, bc, ref, Backend::kCpu);
  const bool cuda = std::find(options.backends.begin(), options.backends.end(), Backend::kCuda) !=
                    options.backends.end();
  const Tolerance cuda_tol = cuda ? tolerance_for(c, bc, ref, Backend::kCuda) : cpu_tol;
  // Checked and unchecked CUDA runs must agree on valid input: alternate per case.
  const bool checked = (c.spec.seed >> 7) & 1;

  Outcome outcome;
  std::vector<std::pair<Backend, Result>> planned;
  for (Backend backend : options.backends) {
    const std::string tag = std::string(backend_name(backend)) + ": ";
    if (backend == Backend::kCuda && !bc.cuda_refuses.empty()) {
      // A stride the CPU takes and the CUDA backend must refuse, naming it.
      Outcome o = expect_error(backend, bc, threads, checked, ErrorCode::kInvalidArgument,
                               bc.cuda_refuses, "a misaligned row stride");
      if (o.failed()) return o;
      continue;
    }
    const Tolerance& tol = backend == Backend::kCuda ? cuda_tol : cpu_tol;
    Result runs[2];  // [0] the planner's plan, [1] a single split
    for (int single = 0; single < 2; ++single) {
      bc.poison_outputs();
      try {
        run_backend(backend, bc, threads, single == 1, checked);
      } catch (const std::exception& e) {
        return fail("throw", tag + "threw on a valid case: " + e.what());
      }
      const std::string plan = single ? "single split: " : "";
      if (std::string bad = check_gaps(bc); !bad.empty()) return fail("gap", tag + plan + bad);
      runs[single] = read_outputs(bc);
      if (std::string bad = check_finite(runs[single], bc, a.sinks); !bad.empty()) {
        return fail("finite", tag + plan + bad);
      }
      if (std::string bad = compare(bc, runs[single], ref.out, ref.lse, tol, &outcome.worst_ratio);
          !bad.empty()) {
        return fail("reference", tag + plan + bad);
      }
    }
    // Plan invariance: the split plan may only change the rounding.
    double ignored = 0;
    if (std::string bad = compare(bc, runs[0], runs[1].out, runs[1].lse, tol, &ignored);
        !bad.empty()) {
      return fail("plan", tag + "planner vs single split: " + bad);
    }
    planned.emplace_back(backend, std::move(runs[0]));
  }
  if (std::string bad = check_context_parallel(c, bc, ref, cpu_tol, &outcome.worst_ratio, options);
      !bad.empty()) {
    return fail("context-parallel", bad);
  }
  // Backends against each other (the first one that ran is the baseline), to the looser bounds.
  for (std::size_t i = 1; i < planned.size(); ++i) {
    double ignored = 0;
    if (std::string bad = compare(bc, planned[i].second, planned[0].second.out,
                                  planned[0].second.lse, cuda_tol, &ignored);
        !bad.empty()) {
      return fail("cross", std::string(backend_name(planned[i].first)) + " vs " +
                               backend_name(planned[0].first) + ": " + bad);
    }
  }
  return outcome;
}

}  // namespace pagedattn::fuzz
