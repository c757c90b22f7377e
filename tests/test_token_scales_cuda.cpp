// Per-token K and V scales on the CUDA backend (DecodeArgs::k_token_scales,
// docs/kv_quantization.md): decode against the f64 reference over int8 and fp8 caches (head dims,
// groups, block sizes, q dtypes, multi-token queries with every variant, NHD scale strides, V
// scales far from 1 on the tensor cores), in checked and unchecked mode; checked mode's error
// naming a read row's bad scale, with out untouched; and the scales of rows nobody reads left
// alone. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "quantized_spec.hpp"
#include "query_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::HostCase;

bool no_device() { return !cuda_available() || !testing::device_memory_built(); }

detail::DecodeOptions cuda_options(bool checked) {
  detail::DecodeOptions o;
  o.backend = Backend::kCuda;
  o.cuda_checked = checked;
  return o;
}

void expect_close(const HostCase& c, const ReferenceResult& want, const std::string& what) {
  const testing::Comparison cmp = testing::compare_outputs(c, want);
  EXPECT_TRUE(cmp.all_finite) << what << ": " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype)) << what;
  EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << what;
}

TEST(TokenScalesCuda, DecodeMatchesTheReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::uint64_t salt = 2000;
  for (DType cache : {DType::kInt8, DType::kFP8E4M3, DType::kFP8E5M2}) {
    for (int D : {64, 80, 128, 256}) {
      for (int G : {1, 4, 8}) {
        for (DType t : {DType::kF32, DType::kBF16}) {
          const int BS = salt % 3 == 0 ? 1 : salt % 3 == 1 ? 16 : 32;
          HostCase c = testing::make_case(quantized_spec(
              cache, t, 2 * G, 2, D, BS, {37, 0, 129, 1, 700}, true, testing::seed_for(++salt)));
          const ReferenceResult want = reference_decode(c.args());
          c.poison_outputs();
          testing::cuda_decode_from_host(c.args(), cuda_options(salt % 2 == 0));
          expect_close(c, want, testing::describe(c.spec));
        }
      }
    }
  }
}

TEST(TokenScalesCuda, MultiTokenQueriesAndVariants) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::uint64_t salt = 2100;
  for (DType cache : {DType::kInt8, DType::kFP8E4M3}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      testing::CaseSpec spec =
          quantized_spec(cache, t, 8, 2, 128, 16, {40, 7, 100}, true, testing::seed_for(++salt));
      QueryCase qc = make_query_case(spec, {3, 7, 1});
      DecodeArgs a = qc.args();
      std::vector<float> slopes(spec.num_heads, -0.03f), sinks(spec.num_heads, 0.5f);
      a.window_left = 50;
      a.logits_soft_cap = 20.f;
      a.alibi_slopes = slopes.data();
      a.sinks = sinks.data();
      const ReferenceResult want = reference_decode(a);
      qc.c.poison_outputs();
      testing::cuda_decode_from_host(a, cuda_options(true));
      expect_close(qc.c, want, qc.describe());
    }
  }
}

// On the tensor cores each weight goes to f16 fragments as p x s_v / (the warp's largest s_v):
// V scales far from 1 (p x s_v alone would leave f16's range) and spread over 2^80 (the largest
// growing tile after tile) stay exact to the tolerance. K scales keep a modest spread: a huge one
// makes logits whose f32 rounding alone exceeds the tolerance.
TEST(TokenScalesCuda, TensorCoresTakeVScalesFarFromOne) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::uint64_t salt = 2400;
  for (DType cache : {DType::kInt8, DType::kFP8E4M3}) {
    for (int G : {1, 8}) {
      for (int regime = 0; regime < 3; ++regime) {
        HostCase c = testing::make_case(quantized_spec(cache, DType::kBF16, 2 * G, 2, 128, 16,
                                                       {300, 17, 1000, 64}, true,
                                                       testing::seed_for(++salt)));
        std::mt19937_64 rng(testing::seed_for(salt + 50));
        std::uniform_real_distribution<float> unit(1.f, 2.f), spread(-40.f, 40.f);
        for (float& v : c.v_token_scales) {
          if (std::isnan(v)) continue;  // a row nobody reads
          if (regime == 0) v = std::ldexp(unit(rng), static_cast<int>(spread(rng)));
          if (regime == 1) v = std::ldexp(unit(rng), -60);
          if (regime == 2) v = std::ldexp(unit(rng), 60);
        }
        const ReferenceResult want = reference_decode(c.args());
        c.poison_outputs();
        testing::cuda_decode_from_host(c.args(), cuda_options(salt % 2 == 0));
        expect_close(c, want, testing::describe(c.spec) + " regime " + std::to_string(regime));
      }
    }
  }
}

// The scales stored as an NHD engine keeps them ([num_blocks][block_size][num_kv_heads]).
TEST(TokenScalesCuda, TheNhdOrder) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  const int KV = 4, BS = 16;
  HostCase c = testing::make_case(quantized_spec(DType::kInt8, DType::kBF16, 8, KV, 128, BS,
                                                 {33, 70, 300}, true, testing::seed_for(2200)));
  const NhdTokenScales nhd = nhd_token_scales(c, KV, BS);
  const ReferenceResult want = reference_decode(c.args());
  const DecodeArgs a = nhd.args(c);
  c.poison_outputs();
  testing::cuda_decode_from_host(a, cuda_options(false));
  expect_close(c, want, "NHD scales");
}

// Checked mode reads the scales back and validates the rows decode reads, as the CPU backend
// does: a bad one is an error naming it, and nothing is written. A row past the context may hold
// anything.
TEST(TokenScalesCuda, CheckedModeNamesABadRowAndSkipsUnreadOnes) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  HostCase c = testing::make_case(quantized_spec(DType::kInt8, DType::kF32, 8, 2, 64, 16, {5, 40},
                                                 true, testing::seed_for(2300)));
  const int block = c.block_table[c.table_stride + 2];  // sequence 1's third block
  const std::size_t row = (static_cast<std::size_t>(block) * 2 + 1) * 16;  // kv head 1
  c.v_token_scales[row + 8] = 0.f;  // slot 8: past the context of 40
  const ReferenceResult want = reference_decode(c.args());
  c.poison_outputs();
  testing::cuda_decode_from_host(c.args(), cuda_options(true));
  expect_close(c, want, "a zero scale past the context");

  c.v_token_scales[row + 7] = std::numeric_limits<float>::quiet_NaN();  // slot 7: read
  c.poison_outputs();
  const std::vector<std::uint8_t> before = c.out;
  try {
    testing::cuda_decode_from_host(c.args(), cuda_options(true));
    ADD_FAILURE() << "a NaN scale in a read row was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_EQ(e.argument(),
              "v_token_scales[block " + std::to_string(block) + ", kv head 1, slot 7]")
        << e.what();
  }
  EXPECT_EQ(c.out, before) << "a refused decode wrote out";
}

}  // namespace
}  // namespace pagedattn
