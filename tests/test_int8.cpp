// The int8 cache and per-token scales (DType::kInt8, DecodeArgs::k_token_scales): the int8 codes'
// rounding, saturation and NaN; the CPU backend against the f64 reference over int8 and fp8
// caches with and without per-token scales (head dims, groups, block sizes, dtypes, multi-token
// queries, variants, NHD scale strides); write_cache's scales and codes by their definition, and
// a decode of written rows against the unquantized rows' (the formats' accuracy); copy_blocks
// carrying the scales; the argument errors, which write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "quantized_spec.hpp"
#include "query_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::CaseSpec;
using testing::HostCase;

TEST(Int8Codes, RoundToNearestEvenSaturateAndZeroNaN) {
  const std::pair<float, int> cases[] = {
      {0.f, 0},         {0.5f, 0},      {1.5f, 2},       {2.5f, 2},     {-0.5f, 0},
      {-1.5f, -2},      {-2.5f, -2},    {126.5f, 126},   {126.6f, 127}, {127.4f, 127},
      {200.f, 127},     {-200.f, -127}, {-127.6f, -127}, {1e30f, 127},  {-1e30f, -127},
      {0.49999997f, 0}, {3.5f, 4}};
  for (const auto& [x, code] : cases) EXPECT_EQ(float_to_int8(x).bits, code) << x;
  EXPECT_EQ(float_to_int8(INFINITY).bits, 127);
  EXPECT_EQ(float_to_int8(-INFINITY).bits, -127);
  EXPECT_EQ(float_to_int8(std::numeric_limits<float>::quiet_NaN()).bits, 0);
  for (int c = -127; c <= 127; ++c) {
    EXPECT_EQ(float_to_int8(static_cast<float>(c)).bits, c);
    EXPECT_EQ(int8_to_float(int8_code_t{static_cast<std::int8_t>(c)}), static_cast<float>(c));
  }
  // Random values against the nearest integer by search, ties to the even one.
  std::mt19937_64 rng(testing::seed_for(801));
  std::uniform_real_distribution<float> dist(-130.f, 130.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = dist(rng);
    int best = -127;
    for (int c = -126; c <= 127; ++c) {
      const double d = std::fabs(double(x) - c), db = std::fabs(double(x) - best);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    ASSERT_EQ(float_to_int8(x).bits, best) << x;
  }
  EXPECT_EQ(dtype_size(DType::kInt8), 1u);
  EXPECT_STREQ(dtype_name(DType::kInt8), "int8");
  EXPECT_TRUE(is_quantized(DType::kInt8));
  EXPECT_FALSE(is_fp8(DType::kInt8));
}

void expect_matches_reference(HostCase& c, const std::string& what) {
  c.poison_outputs();
  testing::run_decode(c, detail::DecodeOptions(DecodeOptions{Backend::kCpu, 2}));
  const testing::Comparison cmp = testing::compare_with_reference(c);
  EXPECT_TRUE(cmp.all_finite) << what << ": " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype)) << what;
  EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << what;
}

TEST(Int8Decode, CpuMatchesTheReferenceOverShapesAndScales) {
  const DType caches[] = {DType::kInt8, DType::kFP8E4M3, DType::kFP8E5M2};
  const int groups[] = {1, 4, 8};
  const int dims[] = {64, 128, 256, 512};
  std::uint64_t salt = 900;
  for (DType cache : caches) {
    for (bool token_scales : {false, true}) {
      if (cache != DType::kInt8 && !token_scales) continue;  // test_fp8.cpp has those
      for (int D : dims) {
        for (int G : groups) {
          for (DType t : {DType::kF32, DType::kBF16}) {
            const int BS = salt % 3 == 0 ? 1 : salt % 3 == 1 ? 16 : 32;
            HostCase c =
                testing::make_case(quantized_spec(cache, t, 2 * G, 2, D, BS, {37, 0, 129, 1},
                                                  token_scales, testing::seed_for(++salt)));
            expect_matches_reference(c, testing::describe(c.spec));
          }
        }
      }
    }
  }
}

TEST(Int8Decode, MultiTokenQueriesAndVariants) {
  std::uint64_t salt = 1200;
  for (bool token_scales : {false, true}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      CaseSpec spec = quantized_spec(DType::kInt8, t, 8, 2, 128, 16, {40, 7, 100}, token_scales,
                                     testing::seed_for(++salt));
      QueryCase qc = make_query_case(spec, {3, 7, 1});
      DecodeArgs a = qc.args();
      std::vector<float> slopes(spec.num_heads, -0.03f);
      a.window_left = 50;
      a.logits_soft_cap = 20.f;
      a.alibi_slopes = slopes.data();
      detail::decode(a, detail::DecodeOptions(DecodeOptions{Backend::kCpu, 2}));
      const testing::Comparison cmp = testing::compare_outputs(qc.c, reference_decode(a));
      EXPECT_TRUE(cmp.all_finite) << qc.describe() << ": " << cmp.first_bad;
      EXPECT_LE(cmp.rel_err(), testing::out_tolerance(t)) << qc.describe();
      EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << qc.describe();
    }
  }
}

// Per-token scales laid out as an NHD engine keeps them ([num_blocks][block_size][num_kv_heads]),
// through token_scale_strides.
TEST(Int8Decode, TokenScalesInTheNhdOrder) {
  HostCase c = testing::make_case(quantized_spec(DType::kInt8, DType::kF32, 8, 4, 64, 16, {33, 70},
                                                 true, testing::seed_for(1300)));
  const int KV = 4, BS = 16;
  const NhdTokenScales nhd = nhd_token_scales(c, KV, BS);
  const ReferenceResult want = reference_decode(c.args());
  const DecodeArgs a = nhd.args(c);
  c.poison_outputs();
  detail::decode(a, detail::DecodeOptions(DecodeOptions{Backend::kCpu, 2}));
  const testing::Comparison cmp = testing::compare_outputs(c, want);
  EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(DType::kF32));
}

}  // namespace
}  // namespace pagedattn
