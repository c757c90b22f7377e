// A variant added to the CUDA kernels by writing a policy alone (tests/cuda/bucket_bias_variant.cu:
// a bias per head and distance bucket on each logit, and a null-key logit per head in every
// denominator), checked against its own f64 definition here: the proof that the kernels take
// their variants from the policy's hooks, on the one-token, multi-token and wide (many slices per
// warp) paths, over one split and several.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "cuda_device.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "test_seed.hpp"

#if defined(PAGEDATTN_TEST_HAS_CUDA_RUNTIME)
#include "cuda/bucket_bias_variant.hpp"
#include "pagedattn/testing/device_memory.hpp"

namespace pagedattn::testing {
namespace {

constexpr int kHeads = 16, kKvHeads = 4, kDim = 128, kBlock = 16;

// A sequence of `len` tokens with `q_len` query tokens at its end.
struct Seq {
  int len, q_len;
};

struct BiasCase {
  std::vector<Seq> seqs;
  int max_blocks = 0, num_blocks = 0, rows = 0;
  std::vector<bf16_t> q, k, v;  // q [rows][heads][dim]; caches HND
  std::vector<std::int32_t> table, lens, indptr;
  std::vector<float> bias, null_logit;

  explicit BiasCase(std::vector<Seq> s, std::uint64_t seed) : seqs(std::move(s)) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    indptr.push_back(0);
    for (const Seq& sq : seqs) {
      max_blocks = std::max(max_blocks, (sq.len + kBlock - 1) / kBlock);
      lens.push_back(sq.len);
      indptr.push_back(indptr.back() + sq.q_len);
    }
    rows = indptr.back();
    max_blocks = std::max(max_blocks, 1);
    num_blocks = static_cast<int>(seqs.size()) * max_blocks + 2;
    std::vector<std::int32_t> ids(num_blocks);
    for (int i = 0; i < num_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);  // fragmented tables
    table.assign(seqs.size() * max_blocks, -1);
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      for (int j = 0; j < (seqs[b].len + kBlock - 1) / kBlock; ++j) {
        table[b * max_blocks + j] = ids[b * max_blocks + j];
      }
    }
    auto fill = [&](std::vector<bf16_t>& x, std::size_t n, float mag) {
      x.resize(n);
      for (auto& e : x) e = float_to_bf16(u(rng) * mag);
    };
    fill(q, static_cast<std::size_t>(rows) * kHeads * kDim, 2.f);
    fill(k, static_cast<std::size_t>(num_blocks) * kKvHeads * kBlock * kDim, 1.f);
    fill(v, k.size(), 1.f);
    bias.resize(kHeads * kBiasBuckets);
    for (auto& e : bias) e = 3.f * u(rng);
    null_logit.resize(kHeads);
    for (auto& e : null_logit) e = 2.f * u(rng);
  }

  double kv(const std::vector<bf16_t>& c, int b, int kvh, int t, int d) const {
    const int block = table[b * max_blocks + t / kBlock];
    const std::size_t at =
        ((static_cast<std::size_t>(block) * kKvHeads + kvh) * kBlock + t % kBlock) * kDim + d;
    return bf16_to_float(c[at]);
  }

  // The variant's definition in double for row `row` (sequence b, its query token i) and head h:
  // out [kDim] and lse.
  void reference(int b, int i, int h, std::vector<double>& out, double& lse) const {
    const Seq& sq = seqs[b];
    const int pos = sq.len - sq.q_len + i, kvh = h / (kHeads / kKvHeads);
    const int row = indptr[b] + i;
    const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
    std::vector<double> logit;
    for (int t = 0; t <= pos && t < sq.len; ++t) {
      double dot = 0;
      for (int d = 0; d < kDim; ++d) {
        dot += static_cast<double>(
                   bf16_to_float(q[(static_cast<std::size_t>(row) * kHeads + h) * kDim + d])) *
               kv(k, b, kvh, t, d);
      }
      const int bucket = std::min((pos - t) / kBucketTokens, kBiasBuckets - 1);
      logit.push_back(dot * scale + bias[h * kBiasBuckets + bucket]);
    }
    double m = null_logit[h];
    for (double x : logit) m = std::max(m, x);
    double denom = std::exp(null_logit[h] - m);
    out.assign(kDim, 0.0);
    for (std::size_t t = 0; t < logit.size(); ++t) {
      const double w = std::exp(logit[t] - m);
      denom += w;
      for (int d = 0; d < kDim; ++d) out[d] += w * kv(v, b, kvh, static_cast<int>(t), d);
    }
    for (double& x : out) x /= denom;
    lse = m + std::log(denom);
  }
};

void check_bucket_bias(const std::vector<Seq>& seqs) {
  const std::uint64_t seed = seed_for_test();
  BiasCase c(seqs, seed);
  DeviceBuffer q(c.q.data(), c.q.size() * 2), k(c.k.data(), c.k.size() * 2),
      v(c.v.data(), c.v.size() * 2), table(c.table.data(), c.table.size() * 4),
      lens(c.lens.data(), c.lens.size() * 4), indptr(c.indptr.data(), c.indptr.size() * 4),
      bias(c.bias.data(), c.bias.size() * 4),
      null_logit(c.null_logit.data(), c.null_logit.size() * 4);
  const std::size_t out_n = static_cast<std::size_t>(c.rows) * kHeads * kDim;
  std::vector<float> out_nan(out_n, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> lse_nan(static_cast<std::size_t>(c.rows) * kHeads, out_nan[0]);
  DeviceBuffer out(out_nan.data(), out_n * 4), lse(lse_nan.data(), lse_nan.size() * 4);
  DecodeArgs a;
  a.batch = static_cast<int>(seqs.size());
  a.num_heads = kHeads;
  a.num_kv_heads = kKvHeads;
  a.head_dim = kDim;
  a.block_size = kBlock;
  a.num_blocks = c.num_blocks;
  a.max_blocks_per_seq = c.max_blocks;
  a.q = q.get();
  a.q_dtype = a.k_dtype = a.v_dtype = DType::kBF16;
  a.k_cache = k.get();
  a.v_cache = v.get();
  a.block_table = table.as<const std::int32_t>();
  a.context_lens = lens.as<const std::int32_t>();
  a.out = out.get();
  a.out_dtype = DType::kF32;
  a.lse = lse.as<float>();
  a.q_indptr = indptr.as<const std::int32_t>();
  a.num_q_tokens = c.rows;
  a.max_q_len = 0;
  for (const Seq& s : seqs) a.max_q_len = std::max(a.max_q_len, s.q_len);
  decode_with_bucket_bias(a, BucketBias{bias.as<const float>(), null_logit.as<const float>()});
  std::vector<float> got(out_n), got_lse(lse_nan.size());
  copy_to_host(got.data(), out.get(), out_n * 4);
  copy_to_host(got_lse.data(), lse.get(), got_lse.size() * 4);

  double worst = 0, scale = 0, worst_lse = 0;
  std::vector<double> ref;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    for (int i = 0; i < seqs[b].q_len; ++i) {
      const int row = c.indptr[b] + i;
      for (int h = 0; h < kHeads; ++h) {
        double ref_lse = 0;
        c.reference(static_cast<int>(b), i, h, ref, ref_lse);
        const std::size_t at = (static_cast<std::size_t>(row) * kHeads + h) * kDim;
        for (int d = 0; d < kDim; ++d) {
          scale = std::max(scale, std::abs(ref[d]));
          const double err = std::abs(got[at + d] - ref[d]);
          worst = std::isnan(err) ? INFINITY : std::max(worst, err);
        }
        const double lerr = std::abs(got_lse[row * kHeads + h] - ref_lse);
        worst_lse = std::isnan(lerr) ? INFINITY : std::max(worst_lse, lerr);
      }
    }
  }
  std::ostringstream what;
  for (const Seq& s : seqs) what << s.len << "/" << s.q_len << " ";
  EXPECT_LE(worst / std::max(scale, 1e-30), out_tolerance(DType::kF32) * 4)
      << "sequences (len/q_len) " << what.str() << seed_note(seed);
  EXPECT_LE(worst_lse, lse_tolerance())
      << "sequences (len/q_len) " << what.str() << seed_note(seed);
}

TEST(CudaVariantPolicy, OneTokenMatchesItsDefinition) {
  SKIP_WITHOUT_CUDA();
  // 0 and 1 token, a block boundary, one split and several (thousands of tokens).
  check_bucket_bias({{0, 1}, {1, 1}, {16, 1}, {17, 1}, {300, 1}, {5000, 1}});
}

TEST(CudaVariantPolicy, QueryTokensMatchItsDefinition) {
  SKIP_WITHOUT_CUDA();
  // 4 x 3 and 4 x 4 rows (the multi-token path), and the first query token at position 0.
  check_bucket_bias({{3, 3}, {40, 4}, {700, 3}, {3000, 4}});
}

TEST(CudaVariantPolicy, WideRowsMatchItsDefinition) {
  SKIP_WITHOUT_CUDA();
  // 4 x 6 = 24 rows per kv head: the wide build, several slices per warp folded at once.
  check_bucket_bias({{6, 6}, {100, 6}, {2600, 6}});
}

}  // namespace
}  // namespace pagedattn::testing
#endif
