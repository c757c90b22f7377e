// The int4 cache (DType::kInt4): its codes (rounding, saturation, NaN, the nibble order); the CPU
// backend against the f64 reference over head dims, groups, block sizes, dtypes, multi-token
// queries, variants, cache and scale layouts, short contexts and block boundaries, with every
// slot no sequence reads holding the code -8 and NaN scales; every CPU kernel the host has, on
// every code; group scales over many orders of magnitude; and the argument errors, which write
// nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cpu_kernel.hpp"
#include "cpu_kernel_check.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "query_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::CaseSpec;
using testing::HostCase;

TEST(Int4Codes, RoundToNearestEvenSaturateAndZeroNaN) {
  const std::pair<float, int> cases[] = {
      {0.f, 0},    {0.5f, 0},  {1.5f, 2},    {2.5f, 2},        {-0.5f, 0}, {-1.5f, -2},
      {-2.5f, -2}, {6.5f, 6},  {6.6f, 7},    {7.4f, 7},        {100.f, 7}, {-100.f, -7},
      {-7.6f, -7}, {1e30f, 7}, {-1e30f, -7}, {0.49999997f, 0}, {3.5f, 4},  {-3.5f, -4}};
  for (const auto& [x, code] : cases) EXPECT_EQ(float_to_int4(x), code) << x;
  EXPECT_EQ(float_to_int4(INFINITY), 7);
  EXPECT_EQ(float_to_int4(-INFINITY), -7);
  EXPECT_EQ(float_to_int4(std::numeric_limits<float>::quiet_NaN()), 0);
  // A finite value whose quotient by the scale overflows saturates, as int8's does.
  EXPECT_EQ(quantize_int4(3e38f, 1e-30f), 7);
  EXPECT_EQ(quantize_int4(-3e38f, 1e-30f), -7);
  std::mt19937_64 rng(testing::seed_for(4001));
  std::uniform_real_distribution<float> dist(-9.f, 9.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = dist(rng);
    int best = -7;
    for (int c = -6; c <= 7; ++c) {
      const double d = std::fabs(double(x) - c), db = std::fabs(double(x) - best);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    ASSERT_EQ(float_to_int4(x), best) << x;
  }
  EXPECT_STREQ(dtype_name(DType::kInt4), "int4");
  EXPECT_TRUE(is_quantized(DType::kInt4));
  EXPECT_FALSE(is_fp8(DType::kInt4));
  EXPECT_EQ(dtype_bytes(DType::kInt4, 128), 64);
  EXPECT_EQ(dtype_bytes(DType::kInt8, 128), 128);
  EXPECT_EQ(token_scales_per_row(DType::kInt4, 128), 4);
  EXPECT_EQ(token_scales_per_row(DType::kInt8, 128), 1);
  EXPECT_EQ(max_code_magnitude(DType::kInt4), 7.f);
}

// Two's complement nibbles, the even element in the low one; -8 reads as -8.
TEST(Int4Codes, NibbleOrderAndEveryCode) {
  for (int lo = -8; lo <= 7; ++lo) {
    for (int hi = -8; hi <= 7; ++hi) {
      const std::uint8_t b = int4_pack(lo, hi);
      EXPECT_EQ(b & 0xf, lo & 0xf);
      EXPECT_EQ(b >> 4, hi & 0xf);
      EXPECT_EQ(int4_low(b), lo);
      EXPECT_EQ(int4_high(b), hi);
      const std::uint8_t bytes[2] = {b, static_cast<std::uint8_t>(~b)};
      EXPECT_EQ(load_as_float(bytes, DType::kInt4, 0), static_cast<float>(lo));
      EXPECT_EQ(load_as_float(bytes, DType::kInt4, 1), static_cast<float>(hi));
    }
  }
  std::uint8_t row[2] = {0, 0};
  store_from_float(row, DType::kInt4, 1, -3.f);  // the high nibble of byte 0 only
  store_from_float(row, DType::kInt4, 2, 5.f);
  EXPECT_EQ(row[0], 0xd0);
  EXPECT_EQ(row[1], 0x05);
  store_from_float(row, DType::kInt4, 0, 7.f);
  EXPECT_EQ(row[0], 0xd7);
  EXPECT_EQ(round_to(DType::kInt4, 2.5f), 2.f);
  EXPECT_EQ(round_to(DType::kInt4, -9.f), -7.f);
}

// An int4 case: codes over -8..7 with per-tensor scales that give values of the usual spread, a
// scale per group of 32 in [0.25, 4), per-head scales on even seeds.
CaseSpec int4_spec(DType q_and_out, int H, int KV, int D, int BS, std::vector<int> lens,
                   std::uint64_t seed) {
  CaseSpec s = testing::shaped_spec(q_and_out, H, KV, D, BS, std::move(lens));
  s.kv_dtype = DType::kInt4;
  s.k_scale = 0.125f;
  s.v_scale = 0.25f;
  s.per_head_scales = seed % 2 == 0;
  s.seed = seed;
  return s;
}

constexpr DecodeOptions kCpu2{Backend::kCpu, 2};

void expect_near(const HostCase& c, const ReferenceResult& want, const std::string& what) {
  const testing::Comparison cmp = testing::compare_outputs(c, want);
  EXPECT_TRUE(cmp.all_finite) << what << ": " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype)) << what;
  EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << what;
}

void expect_matches_reference(HostCase& c, const std::string& what) {
  c.poison_outputs();
  testing::run_decode(c, detail::DecodeOptions(kCpu2));
  const testing::Comparison cmp = testing::compare_with_reference(c);
  EXPECT_TRUE(cmp.all_finite) << what << ": " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype)) << what;
  EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << what;
}

TEST(Int4Decode, CpuMatchesTheReferenceOverShapes) {
  std::uint64_t salt = 4100;
  for (int D : {64, 96, 128, 192, 256, 512}) {
    for (int G : {1, 3, 8}) {
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        const int BS = salt % 4 == 0 ? 1 : salt % 4 == 1 ? 16 : salt % 4 == 2 ? 7 : 32;
        HostCase c = testing::make_case(
            int4_spec(t, 2 * G, 2, D, BS, {37, 0, 129, 1}, testing::seed_for(++salt)));
        expect_matches_reference(c,
                                 testing::describe(c.spec) + " " + testing::seed_note(c.spec.seed));
      }
    }
  }
}

// Context 0 and 1, and lengths on each side of block boundaries; one sequence much longer than
// the rest (split across the threads).
TEST(Int4Decode, ShortContextsAndBlockBoundaries) {
  std::uint64_t salt = 4200;
  for (int BS : {16, 32}) {
    for (int KV : {1, 4}) {
      std::vector<int> lens = {0, 1, BS - 1, BS, BS + 1, 2 * BS, 2 * BS + 1, 3000};
      HostCase c = testing::make_case(
          int4_spec(DType::kBF16, 8, KV, 128, BS, lens, testing::seed_for(++salt)));
      expect_matches_reference(c, testing::describe(c.spec));
    }
  }
}

TEST(Int4Decode, MultiTokenQueriesAndVariants) {
  std::uint64_t salt = 4300;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int variant = 0; variant < 5; ++variant) {
      CaseSpec spec = int4_spec(t, 8, 2, 128, 16, {40, 7, 100, 0}, testing::seed_for(++salt));
      QueryCase qc = make_query_case(spec, {3, 7, 1, 0});
      DecodeArgs a = qc.args();
      std::vector<float> slopes(spec.num_heads, -0.03f), sinks(spec.num_heads, 1.5f);
      if (variant == 1 || variant == 4) a.window_left = 50;
      if (variant == 2 || variant == 4) a.logits_soft_cap = 5.f;
      if (variant == 3 || variant == 4) a.alibi_slopes = slopes.data();
      if (variant >= 3) a.sinks = sinks.data();
      detail::decode(a, detail::DecodeOptions(kCpu2));
      const testing::Comparison cmp = testing::compare_outputs(qc.c, reference_decode(a));
      EXPECT_TRUE(cmp.all_finite) << qc.describe() << ": " << cmp.first_bad;
      EXPECT_LE(cmp.rel_err(), testing::out_tolerance(t)) << qc.describe() << " v" << variant;
      EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << qc.describe();
    }
  }
}

// The group scales in another layout: NHD ([num_blocks][block_size][num_kv_heads][D / 32]) and a
// padded one (gaps of NaN), from the case's dense scales.
std::vector<float> relayout_scales(const HostCase& c, const std::vector<float>& dense,
                                   const CacheStrides& to) {
  const int KV = c.spec.num_kv_heads, BS = c.spec.block_size, n = c.spec.head_dim / 32;
  const CacheLayout from = CacheLayout::dense(c.num_blocks, KV, BS, n);
  const CacheLayout l = CacheLayout::with_strides(c.num_blocks, KV, BS, n, to);
  std::vector<float> out(static_cast<std::size_t>(l.elements()),
                         std::numeric_limits<float>::quiet_NaN());
  for (int b = 0; b < c.num_blocks; ++b) {
    for (int h = 0; h < KV; ++h) {
      for (int t = 0; t < BS; ++t) {
        for (int g = 0; g < n; ++g) out[l.offset(b, h, t) + g] = dense[from.offset(b, h, t) + g];
      }
    }
  }
  return out;
}

// Every cache layout of kv_layouts.hpp (strides counted in codes) with the group scales dense, NHD
// and padded: the reference of each layout and the CPU backend both give the dense case's result.
TEST(Int4Decode, CacheAndScaleLayouts) {
  HostCase c = testing::make_case(
      int4_spec(DType::kF32, 8, 2, 64, 16, {33, 70, 1}, testing::seed_for(4400)));
  const ReferenceResult want = reference_decode(c.args());
  const int KV = 2, BS = 16, n = 2;
  const CacheStrides scale_layouts[] = {
      {},
      CacheStrides::nhd(KV, BS, n),
      CacheStrides{KV * BS * (n + 3) + 5, BS * (n + 3) + 1, n + 3}};
  for (testing::KvLayout layout : testing::kAllKvLayouts) {
    const testing::KvStorage st = testing::store_kv(c, layout);
    for (const CacheStrides& ss : scale_layouts) {
      SCOPED_TRACE(std::string(testing::kv_layout_name(layout)) + " scale strides {" +
                   std::to_string(ss.block) + ", " + std::to_string(ss.head) + ", " +
                   std::to_string(ss.token) + "}");
      std::vector<float> ks =
          ss.is_default() ? c.k_token_scales : relayout_scales(c, c.k_token_scales, ss);
      std::vector<float> vs =
          ss.is_default() ? c.v_token_scales : relayout_scales(c, c.v_token_scales, ss);
      DecodeArgs a = c.args();
      st.apply(a, st.k.data(), st.v.data());
      a.k_token_scales = ks.data();
      a.v_token_scales = vs.data();
      a.token_scale_strides = ss;
      const ReferenceResult ref = reference_decode(a);
      EXPECT_EQ(ref.out, want.out);
      c.poison_outputs();
      detail::decode(a, detail::DecodeOptions(kCpu2));
      expect_near(c, want, "layout");
    }
  }
}

// Group scales spread over twelve orders of magnitude within each row: a kernel that took one
// scale per row (or ignored them) would be far off. The check on the reference itself shows it:
// the result with every group given its row's first scale differs by far more than the tolerance.
TEST(Int4Decode, GroupScalesOverManyOrdersOfMagnitude) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    HostCase c =
        testing::make_case(int4_spec(t, 8, 2, 128, 16, {50, 200, 3}, testing::seed_for(4500)));
    std::mt19937_64 rng(testing::seed_for(4501));
    std::uniform_real_distribution<float> exponent(-6.f, 6.f);
    for (std::size_t i = 0; i < c.k_token_scales.size(); ++i) {
      if (std::isnan(c.k_token_scales[i])) continue;  // rows no sequence reads
      // K's small enough that the logits stay moderate: 1e-6 to 1e0.
      c.k_token_scales[i] = std::pow(10.f, exponent(rng) / 2 - 3);
      c.v_token_scales[i] = std::pow(10.f, exponent(rng));
    }
    expect_matches_reference(c, testing::describe(c.spec));
    // The same rows with each row's first group scale for all its groups: another result.
    std::vector<float> ks = c.k_token_scales, vs = c.v_token_scales;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      ks[i] = ks[i / 4 * 4];
      vs[i] = vs[i / 4 * 4];
    }
    DecodeArgs a = c.args();
    a.k_token_scales = ks.data();
    a.v_token_scales = vs.data();
    const testing::Comparison cmp = testing::compare_outputs(c, reference_decode(a));
    EXPECT_GT(cmp.rel_err(), 100 * testing::out_tolerance(t))
        << "the group scales do not change the result";
  }
}

// The CPU kernels this host runs, by their PAGEDATTN_CPU_ISA names.
const char* const kCpuIsas[] = {"amx", "avx512bf16", "avx512", "avx2", "sse2", "neon"};

// Every code through every CPU kernel the host has, in V: a context of one token has weight 1, so
// out is exactly its V row, code x group scale (powers of two: exact); q f32 and bf16, the weights
// in f32 and rounded to bf16 (1 stays exact).
TEST(Int4CpuIsa, EveryCodeAndGroupScaleExactlyInV) {
  int kernels = 0;
  for (const char* isa : kCpuIsas) {
    const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa(isa);
    if (fn == nullptr) continue;
    ++kernels;
    for (int D : {64, 128, 256}) {
      for (DType q_dtype : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::string(isa) + " D " + std::to_string(D) + " q " + dtype_name(q_dtype));
        CaseSpec spec = int4_spec(q_dtype, 1, 1, D, 16, {1}, testing::seed_for(4600));
        spec.per_head_scales = false;
        spec.k_scale = spec.v_scale = 1.f;
        HostCase c = testing::make_case(spec);
        const DecodeArgs a = c.args();
        const int id = c.block_table[0];
        const std::int64_t row = a.cache_layout().offset(id, 0, 0);
        const std::int64_t srow = a.token_scale_layout().offset(id, 0, 0);
        for (int d = 0; d < D; ++d) int4_store(c.v.data(), row + d, (d % 16) - 8 + (d / 16) % 2);
        for (int g = 0; g < D / 32; ++g) c.v_token_scales[srow + g] = std::ldexp(1.f, 3 * g - 4);
        std::vector<float> q(D, 0.f);  // logit 0
        for (bool bf16_weights : {false, true}) {
          detail::cpu::ItemContext ctx = detail::cpu::item_context(a, q.data());
          ctx.bf16_weights = bf16_weights;
          alignas(64) float scores[detail::cpu::kHeadTile * 256];
          std::vector<float> q_buffer(D + 16), rows(2 * 16 * D);
          float m = 0.f, lsum = 0.f;
          std::vector<float> acc(D);
          fn(ctx, WorkItem{0, 0, 0, 0, 1}, 1, &m, &lsum, acc.data(),
             detail::cpu::ItemScratch{scores, q_buffer.data(), rows.data()});
          for (int d = 0; d < D; ++d) {
            const int code = int4_code(c.v.data(), row + d);
            EXPECT_EQ(acc[d] / lsum, code * std::ldexp(1.f, 3 * (d / 32) - 4)) << "d " << d;
          }
        }
      }
    }
  }
  EXPECT_GT(kernels, 0);
}

// Every CPU kernel the host has against the f64 reference on random int4 caches (every code,
// -8 included), group sizes that leave partial head tiles, q f32 and bf16, the slots no sequence
// reads poisoned (code -8, NaN scales). Each sequence's kv heads run as one task, as the backend
// runs them, and the result is finished as the backend does (q x scale x K scale in, x V scale
// out).
TEST(Int4CpuIsa, EveryKernelMatchesTheReference) {
  for (const char* isa : kCpuIsas) {
    const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa(isa);
    if (fn == nullptr) continue;
    for (int D : {64, 96, 128, 256, 512}) {
      for (DType q_dtype : {DType::kF32, DType::kBF16}) {
        const int group = D == 128 ? 8 : D == 96 ? 3 : 5;
        CaseSpec spec = int4_spec(q_dtype, 2 * group, 2, D, D == 96 ? 7 : 16, {45, 1, 130},
                                  testing::seed_for_test() + D);
        spec.out_dtype = DType::kF32;
        HostCase c = testing::make_case(spec);
        const DecodeArgs a = c.args();
        expect_kernel_matches_reference(
            fn, a, isa, testing::describe(spec) + " " + testing::seed_note(spec.seed), DType::kF32);
      }
    }
  }
}

HostCase int4_case() {
  CaseSpec spec = bad_input_spec();  // head_dim 64: two groups a row
  spec.kv_dtype = DType::kInt4;
  spec.k_scale = spec.v_scale = 0.1f;
  return testing::make_case(spec);
}

void expect_decode_error(HostCase& c, const DecodeArgs& a, ErrorCode code,
                         const std::string& argument, const std::vector<std::string>& parts,
                         Backend backend = Backend::kCpu) {
  const Unwritten before(c);
  expect_error(
      [&] {
        decode(a, DecodeOptions{backend, 2});
      },
      code, argument, parts, "decode with a bad " + argument);
  before.check();
}

TEST(Int4Errors, DecodeNamesTheArgument) {
  HostCase c = int4_case();
  DecodeArgs a = c.args();
  a.k_token_scales = a.v_token_scales = nullptr;
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "k_token_scales",
                      {"int4", "group scales", "head_dim / 32"});
  a = c.args();
  a.v_token_scales = nullptr;
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "v_token_scales", {"pairs"});
  a = c.args();
  a.q_dtype = DType::kInt4;
  expect_decode_error(c, a, ErrorCode::kUnsupported, "q_dtype", {"int4", "caches only"});
  a = c.args();
  a.out_dtype = DType::kInt4;
  expect_decode_error(c, a, ErrorCode::kUnsupported, "out_dtype", {"int4", "caches only"});
  a = c.args();
  a.v_dtype = DType::kInt8;
  expect_decode_error(c, a, ErrorCode::kUnsupported, "v_dtype", {"int8", "k_dtype (int4)"});
  // A head dim that is not a multiple of 32 (80 is one decode otherwise takes).
  a = c.args();
  a.head_dim = 80;
  expect_decode_error(c, a, ErrorCode::kUnsupported, "head_dim", {"80", "multiple of 32"});
  // Strides count codes: an odd one would start rows inside a byte.
  a = c.args();
  a.kv_strides = CacheStrides::nhd(2, 8, 64);
  a.kv_strides.token += 1;
  a.kv_strides.block = a.kv_strides.token * 8;
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "kv_strides.token", {"129", "even"});
  // Scale strides of one scale per row leave the two groups of a row overlapping the next row's.
  a = c.args();
  a.token_scale_strides = CacheStrides::hnd(2, 8, 1);
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "token_scale_strides.token", {"overlap"});
  // A read row's group scale out of range names the row and the group; NaN in the slots past a
  // context does not matter (make_case poisons those).
  const int id = c.block_table[0];
  const std::size_t row = ((static_cast<std::size_t>(id) * 2 + 1) * 8 + 3) * 2;  // kv 1, slot 3
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), 0.f, -1.f, 1e31f, 1e-31f}) {
    c.k_token_scales[row + 1] = bad;
    expect_decode_error(
        c, c.args(), ErrorCode::kInvalidArgument,
        "k_token_scales[block " + std::to_string(id) + ", kv head 1, slot 3, group 1]",
        {"must be in"});
    c.k_token_scales[row + 1] = 1.f;
  }
  c.v_token_scales[row] = INFINITY;
  expect_decode_error(
      c, c.args(), ErrorCode::kInvalidArgument,
      "v_token_scales[block " + std::to_string(id) + ", kv head 1, slot 3, group 0]",
      {"must be in"});
}

// The CUDA backend has no int4 kernels: decode, write_cache and copy_blocks refuse the dtype by
// name before anything runs (here where CUDA is built and a device present).
TEST(Int4Errors, CudaRefusesInt4) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  HostCase c = int4_case();
  expect_decode_error(c, c.args(), ErrorCode::kUnsupported, "k_dtype", {"int4", "CUDA"},
                      Backend::kCuda);
  std::vector<std::uint8_t> k(4 * 2 * 8 * 32), v(k.size());
  std::vector<float> ks(4 * 2 * 8 * 2), vs(ks.size());
  std::vector<float> key(2 * 64), value(key.size());
  const std::int32_t slot = 3;
  auto w = testing::pool_args<CacheWriteArgs>(2, 64, 8, 4, k.data(), v.data(), DType::kInt4);
  w.num_tokens = 1;
  w.key = key.data();
  w.value = value.data();
  w.slot_mapping = &slot;
  w.k_token_scales = ks.data();
  w.v_token_scales = vs.data();
  CacheOpOptions o;
  o.backend = Backend::kCuda;
  expect_error([&] { write_cache(w, o); }, ErrorCode::kUnsupported, "cache_dtype", {"int4"},
               "an int4 write on CUDA");
  auto cp = testing::pool_args<CopyBlocksArgs>(2, 64, 8, 4, k.data(), v.data(), DType::kInt4);
  cp.k_token_scales = ks.data();
  cp.v_token_scales = vs.data();
  const BlockCopy pair{0, 1};
  cp.pairs = &pair;
  cp.num_pairs = 1;
  expect_error([&] { copy_blocks(cp, o); }, ErrorCode::kUnsupported, "cache_dtype", {"int4"},
               "an int4 block copy on CUDA");
}

}  // namespace
}  // namespace pagedattn
