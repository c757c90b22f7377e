// The MLA test cases (pagedattn/mla.hpp) the CPU and CUDA suites share: a fragmented latent cache
// in host memory with NaN in every slot no query reads, and the check of out and lse against the
// f64 reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/mla.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/tolerance.hpp"

namespace pagedattn::mla_testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct MlaSpec {
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  int heads = 16;
  int rank = 512;
  int rope = 64;
  int block_size = 16;
  std::vector<int> lens = {0, 1, 63, 300};
  std::vector<int> q_lens;  // empty: one query token per sequence
  bool combined = false;    // one [blocks][block_size][rank + rope] tensor
  int row_pad = 0;          // elements after each latent row (and each q and out row)
  std::uint64_t seed = 1;
};

// A fragmented latent cache with NaN in every slot no query reads, garbage past each table row's
// used entries, q rows of N(0, 1) values and out and lse poisoned with NaN.
struct MlaCase {
  MlaSpec spec;
  int num_blocks = 0, max_blocks = 0;
  std::vector<std::uint8_t> q_nope, q_pe, c, kpe, out;
  std::vector<float> lse;
  std::vector<std::int32_t> table, lens, indptr;
  float kv_scale = 1.f;

  int rows() const { return spec.q_lens.empty() ? static_cast<int>(lens.size()) : indptr.back(); }
  std::int64_t latent_stride() const {
    return (spec.combined ? spec.rank + spec.rope : spec.rank) + spec.row_pad;
  }
  MlaDecodeArgs args() {
    const MlaSpec& s = spec;
    MlaDecodeArgs a;
    a.batch = static_cast<int>(lens.size());
    a.num_heads = s.heads;
    a.kv_lora_rank = s.rank;
    a.rope_dim = s.rope;
    a.block_size = s.block_size;
    a.num_blocks = num_blocks;
    a.max_blocks_per_seq = max_blocks;
    a.q_nope = q_nope.data();
    a.q_pe = q_pe.data();
    a.q_dtype = s.q_dtype;
    a.q_nope_row_stride = static_cast<std::int64_t>(s.heads) * s.rank + s.row_pad;
    a.q_pe_row_stride = static_cast<std::int64_t>(s.heads) * s.rope + s.row_pad;
    a.out_row_stride = static_cast<std::int64_t>(s.heads) * s.rank + s.row_pad;
    const std::int64_t token = latent_stride();
    a.c_cache = c.data();
    a.kpe_cache = s.combined ? c.data() + s.rank * dtype_size(s.kv_dtype) : kpe.data();
    a.c_strides = {token * s.block_size, token};
    a.kpe_strides =
        s.combined ? a.c_strides
                   : MlaPartStrides{static_cast<std::int64_t>(s.rope + s.row_pad) * s.block_size,
                                    s.rope + s.row_pad};
    a.kv_dtype = s.kv_dtype;
    a.kv_scale = kv_scale;
    a.block_table = table.data();
    a.context_lens = lens.data();
    if (!s.q_lens.empty()) {
      a.q_indptr = indptr.data();
      a.num_q_tokens = indptr.back();
      a.max_q_len = std::max(1, *std::max_element(s.q_lens.begin(), s.q_lens.end()));
    }
    a.out = out.data();
    a.out_dtype = s.out_dtype;
    a.lse = lse.data();
    return a;
  }
  void poison_outputs() {
    for (std::size_t i = 0; i < out.size() / dtype_size(spec.out_dtype); ++i) {
      store_from_float(out.data(), spec.out_dtype, i, kNaN);
    }
    std::fill(lse.begin(), lse.end(), kNaN);
  }
};

inline MlaCase make_mla_case(const MlaSpec& s) {
  MlaCase m;
  m.spec = s;
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int B = static_cast<int>(s.lens.size());
  m.lens.assign(s.lens.begin(), s.lens.end());
  m.indptr.push_back(0);
  for (int b = 0; b < B && !s.q_lens.empty(); ++b)
    m.indptr.push_back(m.indptr.back() + s.q_lens[b]);
  for (int L : s.lens) m.max_blocks = std::max(m.max_blocks, (L + s.block_size - 1) / s.block_size);
  m.max_blocks += 1;  // a spare entry past every context
  int used = 0;
  for (int L : s.lens) used += (L + s.block_size - 1) / s.block_size;
  m.num_blocks = used + 3;  // blocks no sequence reads
  std::vector<int> ids(static_cast<std::size_t>(m.num_blocks));
  for (int i = 0; i < m.num_blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  m.table.assign(static_cast<std::size_t>(B) * m.max_blocks, 0);
  int next = 0;
  for (int b = 0; b < B; ++b) {
    const int n = (s.lens[b] + s.block_size - 1) / s.block_size;
    for (int i = 0; i < m.max_blocks; ++i) {
      m.table[static_cast<std::size_t>(b) * m.max_blocks + i] =
          i < n ? ids[next++] : static_cast<std::int32_t>(rng() % 1000) - 500;
    }
  }
  // The latent rows: N(0, 1) values (an fp8 cache holds them / kv_scale), NaN where unread.
  if (is_fp8(s.kv_dtype)) m.kv_scale = 0.5f;
  const std::int64_t token = m.latent_stride();
  const std::size_t esz = dtype_size(s.kv_dtype);
  const std::int64_t c_elems = static_cast<std::int64_t>(m.num_blocks) * s.block_size * token;
  const std::int64_t p_token = s.rope + s.row_pad;
  const std::int64_t p_elems = static_cast<std::int64_t>(m.num_blocks) * s.block_size * p_token;
  m.c.assign(static_cast<std::size_t>(c_elems) * esz, 0);
  if (!s.combined)
    m.kpe.assign(static_cast<std::size_t>(std::max<std::int64_t>(p_elems, 1)) * esz, 0);
  for (std::int64_t i = 0; i < c_elems; ++i) store_from_float(m.c.data(), s.kv_dtype, i, kNaN);
  for (std::int64_t i = 0; i < p_elems && !s.combined; ++i) {
    store_from_float(m.kpe.data(), s.kv_dtype, i, kNaN);
  }
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < s.lens[b]; ++t) {
      const std::int64_t id =
          m.table[static_cast<std::size_t>(b) * m.max_blocks + t / s.block_size];
      const std::int64_t slot = id * s.block_size + t % s.block_size;
      for (int d = 0; d < s.rank + s.rope; ++d) {
        const float v = normal(rng) / m.kv_scale;
        if (d < s.rank || s.combined) {
          store_from_float(m.c.data(), s.kv_dtype, slot * token + d, v);
        } else {
          store_from_float(m.kpe.data(), s.kv_dtype, slot * p_token + d - s.rank, v);
        }
      }
    }
  }
  const int rows = s.q_lens.empty() ? B : m.indptr.back();
  const std::int64_t qn = static_cast<std::int64_t>(s.heads) * s.rank + s.row_pad;
  const std::int64_t qp = static_cast<std::int64_t>(s.heads) * s.rope + s.row_pad;
  m.q_nope.assign(static_cast<std::size_t>(std::max(rows, 1) * qn) * dtype_size(s.q_dtype), 0);
  m.q_pe.assign(
      static_cast<std::size_t>(std::max<std::int64_t>(rows * qp, 1)) * dtype_size(s.q_dtype), 0);
  for (std::int64_t i = 0; i < rows * qn; ++i) {
    store_from_float(m.q_nope.data(), s.q_dtype, i, i % qn < qn - s.row_pad ? normal(rng) : kNaN);
  }
  for (std::int64_t i = 0; i < rows * qp; ++i) {
    store_from_float(m.q_pe.data(), s.q_dtype, i, i % qp < qp - s.row_pad ? normal(rng) : kNaN);
  }
  m.out.assign(static_cast<std::size_t>(std::max(rows, 1) * qn) * dtype_size(s.out_dtype), 0);
  m.lse.assign(static_cast<std::size_t>(std::max(rows, 1)) * s.heads, 0.f);
  m.poison_outputs();
  return m;
}

// out and lse of every row against the reference, within the out dtype's tolerance of the
// largest reference value.
inline void expect_matches(MlaCase& m, const ReferenceResult& ref, const std::string& what) {
  const MlaSpec& s = m.spec;
  const MlaDecodeArgs a = m.args();
  double scale = 1e-30, err = 0;
  for (double v : ref.out) scale = std::max(scale, std::fabs(v));
  for (int r = 0; r < m.rows(); ++r) {
    for (int h = 0; h < s.heads; ++h) {
      const std::size_t at = static_cast<std::size_t>(r) * s.heads + h;
      const double want_lse = ref.lse[at], got_lse = m.lse[at];
      if (std::isinf(want_lse) || std::isnan(want_lse)) {
        EXPECT_TRUE(got_lse == want_lse || (std::isnan(want_lse) && std::isnan(got_lse)))
            << what << ": row " << r << " head " << h << " lse " << got_lse << " != " << want_lse;
      } else {
        EXPECT_NEAR(got_lse, want_lse, testing::lse_tolerance())
            << what << ": row " << r << " head " << h;
      }
      for (int d = 0; d < s.rank; ++d) {
        const double want = ref.out[at * s.rank + d];
        const double got = load_as_float(
            a.out, s.out_dtype, r * a.out_row() + static_cast<std::int64_t>(h) * s.rank + d);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << what << ": row " << r << " head " << h << " dim " << d;
          continue;
        }
        ASSERT_TRUE(std::isfinite(got)) << what << ": row " << r << " head " << h << " dim " << d;
        err = std::max(err, std::fabs(got - want));
      }
    }
  }
  EXPECT_LE(err / scale, testing::out_tolerance(s.out_dtype)) << what;
}

}  // namespace pagedattn::mla_testing
