// A paged case whose sequences have several query tokens (DecodeArgs::q_indptr), and the checks
// the multi-token tests share (test_query_tokens.cpp, test_tree_mask.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "variant_args.hpp"

namespace pagedattn {

// A paged case whose sequences have several query tokens: the cache, tables and lengths of a
// make_case case, with q, out and lse holding one row per query token (sized exactly, so that
// reading or writing a row too many shows under a sanitizer).
struct QueryCase {
  testing::HostCase c;
  std::vector<std::int32_t> indptr;  // [batch + 1]
  int max_q_len = 1;

  int rows() const { return indptr.back(); }
  int q_len(int b) const { return indptr[b + 1] - indptr[b]; }
  // The position P of query token i of sequence b (negative: it attends to nothing).
  int position(int b, int i) const { return c.context_lens[b] - q_len(b) + i; }
  DecodeArgs args() {
    DecodeArgs a = c.args();
    a.q_indptr = indptr.data();
    a.num_q_tokens = rows();
    a.max_q_len = max_q_len;
    return a;
  }
  std::string describe() const {
    std::ostringstream os;
    os << testing::describe(c.spec) << " q_indptr=[";
    for (std::size_t i = 0; i < indptr.size(); ++i) os << (i ? "," : "") << indptr[i];
    os << "] max_q_len=" << max_q_len << " " << testing::seed_note(c.spec.seed);
    return os.str();
  }
};

// q_lens[b] query tokens for sequence b; max_q_len is the longest plus `slack` (a bound above
// every count is valid). With no query token at all, q and out keep one row, so that their
// pointers are not null.
inline QueryCase make_query_case(const testing::CaseSpec& spec, const std::vector<int>& q_lens,
                                 int slack = 0) {
  QueryCase qc;
  qc.c = testing::make_case(spec);
  qc.indptr.assign(1, 0);
  int longest = 0;
  for (int n : q_lens) {
    qc.indptr.push_back(qc.indptr.back() + n);
    longest = std::max(longest, n);
  }
  qc.indptr.resize(spec.batch + 1, qc.indptr.back());
  qc.max_q_len = std::max(longest, 1) + slack;
  const std::size_t row = static_cast<std::size_t>(spec.num_heads) * spec.head_dim;
  const std::size_t rows = static_cast<std::size_t>(std::max(qc.rows(), 1));
  std::mt19937_64 rng(spec.seed ^ 0x9a17c0de5eedull);
  std::normal_distribution<float> dist(0.f, spec.magnitude);
  qc.c.q.assign(rows * row * dtype_size(spec.q_dtype), 0);
  for (std::size_t i = 0; i < rows * row; ++i) {
    store_from_float(qc.c.q.data(), spec.q_dtype, i, dist(rng));
  }
  qc.c.out.assign(rows * row * dtype_size(spec.out_dtype), 0);
  qc.c.lse.assign(static_cast<std::size_t>(qc.rows()) * spec.num_heads, 0.f);
  qc.c.poison_outputs();
  return qc;
}

// Stores `value` in K and V of tokens [t_begin, t_end) of sequence `seq`, every kv head.
inline void plant(testing::HostCase& c, int seq, int t_begin, int t_end, float value) {
  const CacheLayout layout =
      CacheLayout::dense(c.num_blocks, c.spec.num_kv_heads, c.spec.block_size, c.spec.head_dim);
  const int BS = c.spec.block_size;
  for (int t = t_begin; t < t_end; ++t) {
    const int block = table_entry(c, seq, t / BS);
    for (int kv = 0; kv < c.spec.num_kv_heads; ++kv) {
      const std::int64_t base = layout.offset(block, kv, t % BS);
      for (int d = 0; d < c.spec.head_dim; ++d) {
        store_from_float(c.k.data(), c.spec.kv_dtype, base + d, value);
        store_from_float(c.v.data(), c.spec.kv_dtype, base + d, value);
      }
    }
  }
}

// Rows [r0, r1) of the case's out and lse against `want` (one row per query token): NaN exactly
// where want has NaN, -inf exactly where it has -inf, the rest within the tolerance of the rows'
// output scale.
inline void expect_rows_near(const QueryCase& qc, const ReferenceResult& want, int r0, int r1,
                             const std::string& what) {
  const testing::HostCase& c = qc.c;
  const int H = c.spec.num_heads, D = c.spec.head_dim;
  double scale = 1e-30, err = 0, lse_err = 0;
  int bad = 0;
  std::string first_bad;
  auto note = [&](std::size_t at, int d, double got, double ref) {
    if (bad++ == 0) {
      std::ostringstream os;
      os << "row " << at / H << " head " << at % H << (d < 0 ? " lse" : " out[")
         << (d < 0 ? "" : std::to_string(d) + "]") << " = " << got << ", want " << ref;
      first_bad = os.str();
    }
  };
  for (int r = r0; r < r1; ++r) {
    for (int h = 0; h < H; ++h) {
      const std::size_t at = static_cast<std::size_t>(r) * H + h;
      const double wl = want.lse[at], gl = c.lse[at];
      if (std::isnan(wl) != std::isnan(gl) || (std::isinf(wl) && wl != gl) ||
          (std::isinf(gl) && wl != gl)) {
        note(at, -1, gl, wl);
      } else if (std::isfinite(wl)) {
        lse_err = std::max(lse_err, std::fabs(gl - wl));
      }
      for (int d = 0; d < D; ++d) {
        const double w = want.out[at * D + d];
        const double g = load_as_float(c.out.data(), c.spec.out_dtype, at * D + d);
        if (std::isnan(w) != std::isnan(g) || (!std::isnan(w) && !std::isfinite(g))) {
          note(at, d, g, w);
        } else if (!std::isnan(w)) {
          scale = std::max(scale, std::fabs(w));
          err = std::max(err, std::fabs(g - w));
        }
      }
    }
  }
  SCOPED_TRACE(what + ": rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") of " +
               qc.describe());
  EXPECT_EQ(bad, 0) << "first: " << first_bad;
  EXPECT_LE(err / scale, testing::out_tolerance(c.spec.out_dtype));
  EXPECT_LE(lse_err, testing::lse_tolerance());
}

}  // namespace pagedattn
