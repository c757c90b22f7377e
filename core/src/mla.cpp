// MLA decode's shared parts: validation (the shapes, the latent cache's shape and strides, which
// the latent cache writes check too, and through the GQA checks the tables and q_indptr) and the
// f64 reference.
#include "pagedattn/mla.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/mla_validate.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {
namespace {

// A width (kv_lora_rank, rope_dim) in [lo, hi] and a multiple of 16.
void require_width(const char* name, int v, int lo, int hi) {
  if (v < lo) fail(ErrorCode::kInvalidArgument, name, v, "must be at least " + std::to_string(lo));
  if (v > hi || v % 16 != 0) {
    fail(ErrorCode::kUnsupported, name, v,
         "unsupported: a multiple of 16 up to " + std::to_string(hi));
  }
}

// A latent part's strides (c_strides, kpe_strides): both 0 (dense), or both positive with rows of
// `width` elements that do not overlap (the smaller stride spans a row, the larger the other
// dimension's extent), the pool within int64.
void require_part_strides(const std::string& field, const MlaPartStrides& s, int num_blocks,
                          int block_size, int width) {
  if (s.block == 0 && s.token == 0) return;
  for (const auto& [name, v] :
       {std::pair{field + ".block", s.block}, {field + ".token", s.token}}) {
    if (v <= 0) {
      fail(ErrorCode::kInvalidArgument, name, v, "must be positive (both 0: the dense layout)");
    }
  }
  // The two dimensions by stride: (stride, count, name).
  struct Dim {
    std::int64_t stride;
    std::int64_t count;
    std::string name;
  };
  Dim lo{s.token, block_size, field + ".token"}, hi{s.block, num_blocks, field + ".block"};
  if (lo.stride > hi.stride) std::swap(lo, hi);
  if (lo.count > 1 || hi.count > 1) {
    if (lo.stride < width && (lo.count > 1 || hi.count > 1)) {
      fail(ErrorCode::kInvalidArgument, lo.name, lo.stride,
           "rows overlap: a stride must cover a row of " + std::to_string(width) + " elements");
    }
    if (hi.count > 1 && lo.count > 1 && hi.stride < lo.stride * lo.count) {
      fail(ErrorCode::kInvalidArgument, hi.name, hi.stride,
           "rows overlap: less than " + lo.name + " x its extent (" +
               std::to_string(lo.stride * lo.count) + ")");
    }
  }
  const long double span = static_cast<long double>(std::max(num_blocks - 1, 0)) * s.block +
                           static_cast<long double>(block_size - 1) * s.token + width;
  if (span > static_cast<long double>(INT64_MAX)) {
    fail(ErrorCode::kInvalidArgument, field + ".block", s.block, "the pool exceeds int64");
  }
}

// A row stride of q_nope, q_pe or out: 0, or at least the row's span.
void require_row_stride(const char* name, std::int64_t stride, std::int64_t span) {
  if (stride != 0 && stride < span) {
    fail(ErrorCode::kInvalidArgument, name, stride,
         "must be 0 (dense) or at least " + std::to_string(span) + ": rows must not overlap");
  }
}

}  // namespace

void validate_mla_cache_shape(int kv_lora_rank, int rope_dim, int block_size, int num_blocks,
                              const MlaPartStrides& c_strides, const MlaPartStrides& kpe_strides,
                              DType kv_dtype) {
  require_width("kv_lora_rank", kv_lora_rank, 16, 1024);
  require_width("rope_dim", rope_dim, 0, 256);
  require_block_size(block_size);
  if (num_blocks < 0) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", num_blocks, "must not be negative");
  }
  require_part_strides("c_strides", c_strides, num_blocks, block_size, kv_lora_rank);
  require_part_strides("kpe_strides", kpe_strides, num_blocks, block_size, rope_dim);
  require_dtype("kv_dtype", kv_dtype);
  if (kv_dtype == DType::kInt8 || kv_dtype == DType::kInt4) {
    fail(ErrorCode::kUnsupported, "kv_dtype", dtype_name(kv_dtype),
         "an MLA cache is f32, f16, bf16 or fp8");
  }
}

void require_mla_kv_scale(DType kv_dtype, float kv_scale) {
  if (is_fp8(kv_dtype)) {
    require_kv_scale("kv_scale", kv_scale);
  } else if (kv_scale != 1.f) {
    fail(ErrorCode::kInvalidArgument, "kv_scale", kv_scale,
         std::string("must be 1 for an unquantized cache (kv_dtype ") + dtype_name(kv_dtype) + ")");
  }
}

float MlaDecodeArgs::effective_scale() const {
  return scale ? *scale : 1.f / std::sqrt(static_cast<float>(kv_lora_rank + rope_dim));
}

DecodeArgs mla_table_view(const MlaDecodeArgs& a) {
  DecodeArgs v;
  v.batch = a.batch;
  v.num_heads = a.num_heads;
  v.num_kv_heads = 1;
  v.block_size = a.block_size;
  v.num_blocks = a.num_blocks;
  v.max_blocks_per_seq = a.max_blocks_per_seq;
  v.block_table_stride = a.block_table_stride;
  v.block_table = a.block_table;
  v.context_lens = a.context_lens;
  v.q_indptr = a.q_indptr;
  v.num_q_tokens = a.num_q_tokens;
  v.max_q_len = a.max_q_len;
  return v;
}

void validate_mla_shapes(const MlaDecodeArgs& a, bool require_out) {
  if (a.batch < 0) fail(ErrorCode::kInvalidArgument, "batch", a.batch, "must not be negative");
  require_positive("num_heads", a.num_heads);
  if (a.num_heads > kMaxMlaHeads) {
    fail(ErrorCode::kUnsupported, "num_heads", a.num_heads,
         "unsupported: at most " + std::to_string(kMaxMlaHeads) + " query heads per latent row");
  }
  validate_mla_cache_shape(a.kv_lora_rank, a.rope_dim, a.block_size, a.num_blocks, a.c_strides,
                           a.kpe_strides, a.kv_dtype);
  // The table and query-token fields, checked as decode checks its own.
  const DecodeArgs table = mla_table_view(a);
  require_table_shape(table);
  require_query_counts(table);
  const std::int64_t H = a.num_heads;
  if (a.q_nope_head_stride != 0 && a.q_nope_head_stride < a.kv_lora_rank) {
    fail(ErrorCode::kInvalidArgument, "q_nope_head_stride", a.q_nope_head_stride,
         "must be 0 or at least kv_lora_rank = " + std::to_string(a.kv_lora_rank));
  }
  if (a.q_pe_head_stride != 0 && a.q_pe_head_stride < a.rope_dim) {
    fail(ErrorCode::kInvalidArgument, "q_pe_head_stride", a.q_pe_head_stride,
         "must be 0 or at least rope_dim = " + std::to_string(a.rope_dim));
  }
  require_row_stride("q_nope_row_stride", a.q_nope_row_stride,
                     (H - 1) * a.q_nope_head() + a.kv_lora_rank);
  require_row_stride("q_pe_row_stride", a.q_pe_row_stride, (H - 1) * a.q_pe_head() + a.rope_dim);
  require_row_stride("out_row_stride", a.out_row_stride, H * a.kv_lora_rank);
  require_value_dtype("q_dtype", a.q_dtype);
  require_value_dtype("out_dtype", a.out_dtype);
  require_mla_kv_scale(a.kv_dtype, a.kv_scale);
  if (a.scale && !std::isfinite(*a.scale)) {
    fail(ErrorCode::kInvalidArgument, "scale", *a.scale, "must be finite");
  }
  require_non_null("block_table", a.block_table);
  require_non_null("context_lens", a.context_lens);
  if (a.batch == 0) return;
  require_non_null("q_nope", a.q_nope);
  if (a.rope_dim > 0) require_non_null("q_pe", a.q_pe);
  require_non_null("c_cache", a.c_cache);
  if (a.rope_dim > 0) require_non_null("kpe_cache", a.kpe_cache);
  if (require_out) require_non_null("out", a.out);
}

void validate_mla_tables(const MlaDecodeArgs& a) {
  const DecodeArgs v = mla_table_view(a);
  validate_q_indptr(v, a.q_indptr);
  validate_tables(v, a.context_lens, a.block_table, a.q_indptr);
}

ReferenceResult mla_reference_decode(const MlaDecodeArgs& a) {
  validate_mla_shapes(a, /*require_out=*/false);
  if (a.batch > 0) validate_mla_tables(a);
  const int H = a.num_heads, R = a.kv_lora_rank, P = a.rope_dim;
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const MlaPartStrides cl = a.c_layout(), pl = a.kpe_layout();
  const double scale = a.effective_scale();
  const double kv_scale = a.kv_scale;
  const int rows = a.batch > 0 ? a.q_rows() : 0;
  const double nan = std::numeric_limits<double>::quiet_NaN();

  ReferenceResult r;
  r.out.assign(static_cast<std::size_t>(rows) * H * R, 0.0);
  r.lse.assign(static_cast<std::size_t>(rows) * H, -std::numeric_limits<double>::infinity());
  r.tokens_share.assign(static_cast<std::size_t>(rows) * H, 0.0);
  for (int b = 0; b < a.batch; ++b) {
    const int row0 = a.q_indptr ? a.q_indptr[b] : b;
    const int n_q = a.q_indptr ? a.q_indptr[b + 1] - row0 : 1;
    for (int i = 0; i < n_q; ++i) {
      const int row = row0 + i;
      const int L = std::max(0, a.context_lens[b] - n_q + i + 1);  // query i attends [0, L)
      if (L == 0) continue;
      // The latent rows: c (the values too) and k_pe, dequantized exactly.
      Eigen::MatrixXd C(L, R), Kpe(L, P);
      for (int t = 0; t < L; ++t) {
        const std::int64_t id = table.block(b, t / a.block_size), slot = t % a.block_size;
        const std::int64_t c0 = id * cl.block + slot * cl.token,
                           p0 = id * pl.block + slot * pl.token;
        for (int d = 0; d < R; ++d)
          C(t, d) = load_as_float(a.c_cache, a.kv_dtype, c0 + d) * kv_scale;
        for (int d = 0; d < P; ++d) {
          Kpe(t, d) = load_as_float(a.kpe_cache, a.kv_dtype, p0 + d) * kv_scale;
        }
      }
      const bool kv_finite = C.allFinite() && Kpe.allFinite();
      for (int h = 0; h < H; ++h) {
        const std::size_t at = static_cast<std::size_t>(row) * H + h;
        Eigen::VectorXd qn(R), qp(P);
        for (int d = 0; d < R; ++d) {
          qn(d) =
              load_as_float(a.q_nope, a.q_dtype, row * a.q_nope_row() + h * a.q_nope_head() + d);
        }
        for (int d = 0; d < P; ++d) {
          qp(d) = load_as_float(a.q_pe, a.q_dtype, row * a.q_pe_row() + h * a.q_pe_head() + d);
        }
        double* out = &r.out[at * R];
        if (!kv_finite || !qn.allFinite() || !qp.allFinite()) {
          std::fill(out, out + R, nan);  // as reference_decode: never a value that looks valid
          r.lse[at] = r.tokens_share[at] = nan;
          continue;
        }
        Eigen::VectorXd s = C * qn;
        if (P > 0) s += Kpe * qp;
        s *= scale;
        const double m = s.maxCoeff();
        const Eigen::VectorXd p = (s.array() - m).exp().matrix();
        const double l = p.sum();
        const Eigen::VectorXd o = C.transpose() * p / l;
        for (int d = 0; d < R; ++d) out[d] = o(d);
        r.lse[at] = m + std::log(l);
        r.tokens_share[at] = 1.0;
      }
    }
  }
  return r;
}

}  // namespace pagedattn
