// Writing int4 caches (CacheWriteArgs with cache_dtype kInt4): each group's scale and codes by the
// definition in cache_ops.hpp, edge groups (zeros, NaN, Inf, huge values), skipped tokens; NHD and
// padded caches with NHD scales, decoded against the reference; copy_blocks carrying codes and
// group scales (one span and row by row); a decode of written rows against the decode of the
// unquantized rows (the accuracy docs/kv_quantization.md states); the argument errors, which
// write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bad_input.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "quantized_write_cases.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

constexpr int kKv = 2, kD = 128, kGroups = kD / 32, kBs = 8, kBlocks = 4;
constexpr CacheOpOptions kCpu{Backend::kCpu, 2};

// A pool of kBlocks int4 blocks in `strides` (default dense HND; codes counted in elements), its
// group scales in `scale_strides`, and rows to write. Bytes no row holds stay 0xee, floats no
// scale holds -1.
struct Pool {
  CacheStrides strides, scale_strides;
  CacheLayout layout, scale_layout;
  std::vector<std::uint8_t> k, v;
  std::vector<float> ks, vs;
  explicit Pool(CacheStrides s = {}, CacheStrides ss = {})
      : strides(s),
        scale_strides(ss),
        layout(CacheLayout::with_strides(kBlocks, kKv, kBs, kD, s)),
        scale_layout(CacheLayout::with_strides(kBlocks, kKv, kBs, kGroups, ss)),
        k(static_cast<std::size_t>(layout.elements() / 2), 0xee),
        v(k.size(), 0xee),
        ks(static_cast<std::size_t>(scale_layout.elements()), -1.f),
        vs(ks.size(), -1.f) {}
  CacheWriteArgs write_args(const std::vector<float>& key, const std::vector<float>& value,
                            const std::vector<std::int32_t>& slots) {
    auto a = testing::pool_args<CacheWriteArgs>(kKv, kD, kBs, kBlocks, k.data(), v.data(),
                                                DType::kInt4, strides);
    a.num_tokens = static_cast<int>(slots.size());
    a.key = key.data();
    a.value = value.data();
    a.slot_mapping = slots.data();
    a.k_token_scales = ks.data();
    a.v_token_scales = vs.data();
    a.token_scale_strides = scale_strides;
    return a;
  }
  CopyBlocksArgs copy_args(const BlockCopy* pairs, int n) {
    auto a = testing::pool_args<CopyBlocksArgs>(kKv, kD, kBs, kBlocks, k.data(), v.data(),
                                                DType::kInt4, strides);
    a.pairs = pairs;
    a.num_pairs = n;
    a.k_token_scales = ks.data();
    a.v_token_scales = vs.data();
    a.token_scale_strides = scale_strides;
    return a;
  }
  // A row's code d, and its group scale g.
  int code(bool is_k, int slot, int kv, int d) const {
    return int4_code((is_k ? k : v).data(), layout.offset(slot / kBs, kv, slot % kBs) + d);
  }
  float scale(bool is_k, int slot, int kv, int g) const {
    return (is_k ? ks : vs)[scale_layout.offset(slot / kBs, kv, slot % kBs) + g];
  }
};

// Each group's scale and codes by the definition: s = max finite |x| over the group / (7 x head
// scale), clamped into [kMinKvScale, kMaxKvScale] (1 without a finite nonzero value); code = x /
// (head scale x s) rounded to nearest even, saturating to +-7, NaN 0.
void expect_row(const Pool& p, const float* x, int slot, int kv, float head, bool is_k) {
  for (int g = 0; g < kGroups; ++g) {
    double amax = 0;
    for (int d = 32 * g; d < 32 * g + 32; ++d) {
      if (std::isfinite(x[d])) amax = std::max(amax, std::fabs(double(x[d])));
    }
    double s = amax > 0 ? amax / (7.0 * head) : 1.0;
    s = std::min(std::max(s, double(kMinKvScale)), double(kMaxKvScale));
    const float got_s = p.scale(is_k, slot, kv, g);
    const char* which = is_k ? "k" : "v";
    EXPECT_EQ(got_s, static_cast<float>(s))
        << which << " slot " << slot << " kv " << kv << " g " << g;
    for (int d = 32 * g; d < 32 * g + 32; ++d) {
      const float q = x[d] / (head * got_s);
      const int want = std::isnan(q) ? 0 : q >= 7.f ? 7 : q <= -7.f ? -7 : int(std::nearbyint(q));
      EXPECT_EQ(p.code(is_k, slot, kv, d), want)
          << which << " slot " << slot << " kv " << kv << " d " << d << " x " << x[d];
    }
  }
}

// The layouts the tests write through, as (kv_strides, token_scale_strides): dense, NHD with NHD
// scales, and a padded pool with padded scales.
std::vector<std::pair<CacheStrides, CacheStrides>> pool_layouts() {
  const CacheStrides padded{kKv * (kBs * (kD + 32) + 64) + 128, kBs * (kD + 32) + 64, kD + 32};
  return {{{}, {}},
          {CacheStrides::nhd(kKv, kBs, kD), CacheStrides::nhd(kKv, kBs, kGroups)},
          {padded, CacheStrides{kKv * kBs * (kGroups + 1) + 3, kBs * (kGroups + 1), kGroups + 1}}};
}

// Rows of tokens with edge groups written through every layout: dense, NHD with NHD scales, and a
// padded pool with padded scales; every written row by the definition, skipped tokens and the
// gaps between rows untouched.
TEST(Int4Writes, GroupScalesAndCodesByTheDefinition) {
  std::mt19937_64 rng(testing::seed_for(4700));
  std::normal_distribution<float> dist(0.f, 3.f);
  for (const auto& [strides, scale_strides] : pool_layouts()) {
    SCOPED_TRACE("kv_strides.token " + std::to_string(strides.token));
    const int tokens = 6;
    std::vector<float> key(std::size_t{tokens} * kKv * kD), value(key.size());
    for (float& x : key) x = dist(rng);
    for (float& x : value) x = dist(rng) * 1e-3f;
    // Edge groups: token 1's K group 0 all zero; token 2's K with NaN and Inf in group 0 and only
    // NaN in group 1; token 3's V huge (group 2 alone tiny); token 4's K group 3 exactly 7 x 1e-31.
    std::fill(key.begin() + kKv * kD, key.begin() + kKv * kD + 32, 0.f);
    key[2 * kKv * kD + 3] = std::numeric_limits<float>::quiet_NaN();
    key[2 * kKv * kD + 5] = INFINITY;
    for (int d = 32; d < 64; ++d) key[2 * kKv * kD + d] = std::numeric_limits<float>::quiet_NaN();
    for (int d = 0; d < kD; ++d) value[3 * kKv * kD + d] = 1e36f * (d % 2 ? 1 : -1);
    for (int d = 64; d < 96; ++d) value[3 * kKv * kD + d] = 1e-36f * (d % 3 ? 1 : -1);
    for (int d = 96; d < 128; ++d) key[4 * kKv * kD + d] = 7e-31f * (d % 2 ? 1 : -1);
    const std::vector<std::int32_t> slots = {0, 9, -1, 31, 17, 4};
    std::vector<float> k_heads = {0.5f, 2.f}, v_heads = {1.f, 0.25f};
    Pool p(strides, scale_strides);
    CacheWriteArgs a = p.write_args(key, value, slots);
    a.k_scale = 0.5f;
    a.k_scales = k_heads.data();
    a.v_scales = v_heads.data();
    write_cache(a, kCpu);
    std::vector<char> written(static_cast<std::size_t>(kBlocks) * kBs, 0);
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      written[slots[t]] = 1;
      for (int kv = 0; kv < kKv; ++kv) {
        const std::size_t src = (std::size_t(t) * kKv + kv) * kD;
        expect_row(p, &key[src], slots[t], kv, 0.5f * k_heads[kv], true);
        expect_row(p, &value[src], slots[t], kv, v_heads[kv], false);
      }
    }
    // Every byte and scale outside the written rows is as it was.
    std::vector<char> row_byte(p.k.size(), 0), scale_at(p.ks.size(), 0);
    for (int s = 0; s < kBlocks * kBs; ++s) {
      if (!written[s]) continue;
      for (int kv = 0; kv < kKv; ++kv) {
        const std::int64_t at = p.layout.offset(s / kBs, kv, s % kBs) / 2;
        std::fill(row_byte.begin() + at, row_byte.begin() + at + kD / 2, 1);
        const std::int64_t sat = p.scale_layout.offset(s / kBs, kv, s % kBs);
        std::fill(scale_at.begin() + sat, scale_at.begin() + sat + kGroups, 1);
      }
    }
    for (std::size_t i = 0; i < p.k.size(); ++i) {
      if (!row_byte[i]) ASSERT_TRUE(p.k[i] == 0xee && p.v[i] == 0xee) << "byte " << i;
    }
    for (std::size_t i = 0; i < p.ks.size(); ++i) {
      if (!scale_at[i]) ASSERT_TRUE(p.ks[i] == -1.f && p.vs[i] == -1.f) << "scale " << i;
    }
  }
}

// bf16 and f16 source rows: quantized from their f32 values.
TEST(Int4Writes, HalfPrecisionSources) {
  std::mt19937_64 rng(testing::seed_for(4750));
  std::normal_distribution<float> dist(0.f, 2.f);
  for (DType src : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(src));
    const int tokens = 3;
    std::vector<float> key(std::size_t{tokens} * kKv * kD), value(key.size());
    std::vector<std::uint8_t> k16(key.size() * 2), v16(key.size() * 2);
    for (std::size_t i = 0; i < key.size(); ++i) {
      store_from_float(k16.data(), src, i, dist(rng));
      store_from_float(v16.data(), src, i, dist(rng));
      key[i] = load_as_float(k16.data(), src, i);
      value[i] = load_as_float(v16.data(), src, i);
    }
    const std::vector<std::int32_t> slots = {3, 30, 12};
    Pool p;
    CacheWriteArgs a = p.write_args(key, value, slots);
    a.key = k16.data();
    a.value = v16.data();
    a.src_dtype = src;
    write_cache(a, kCpu);
    for (int t = 0; t < tokens; ++t) {
      for (int kv = 0; kv < kKv; ++kv) {
        const std::size_t at = (std::size_t(t) * kKv + kv) * kD;
        expect_row(p, &key[at], slots[t], kv, 1.f, true);
        expect_row(p, &value[at], slots[t], kv, 1.f, false);
      }
    }
  }
}

// Rows written into NHD and padded pools (scales NHD and padded), then decoded: the CPU backend
// and the reference agree, and match the decode of the same rows written densely.
TEST(Int4Writes, WrittenLayoutsDecodeAlike) {
  std::mt19937_64 rng(testing::seed_for(4800));
  std::normal_distribution<float> dist(0.f, 1.f);
  const int L = kBlocks * kBs - 3, H = 8;
  std::vector<float> key(std::size_t{L} * kKv * kD), value(key.size()), q(std::size_t{H} * kD);
  for (float& x : key) x = dist(rng);
  for (float& x : value) x = dist(rng);
  for (float& x : q) x = dist(rng);
  std::vector<std::int32_t> slots(L), table = {2, 0, 3, 1}, lens = {L};
  for (int t = 0; t < L; ++t) slots[t] = table[t / kBs] * kBs + t % kBs;
  std::vector<float> first;
  for (const auto& [strides, scale_strides] : pool_layouts()) {
    SCOPED_TRACE("kv_strides.token " + std::to_string(strides.token));
    Pool p(strides, scale_strides);
    // Unwritten slots past the context: code -8 and NaN scales, which no decode may read.
    std::fill(p.ks.begin(), p.ks.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(p.vs.begin(), p.vs.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(p.k.begin(), p.k.end(), 0x88);
    std::fill(p.v.begin(), p.v.end(), 0x88);
    write_cache(p.write_args(key, value, slots), kCpu);
    DecodeArgs a;
    a.batch = 1;
    a.num_heads = H;
    a.num_kv_heads = kKv;
    a.head_dim = kD;
    a.block_size = kBs;
    a.num_blocks = kBlocks;
    a.max_blocks_per_seq = kBlocks;
    a.q = q.data();
    a.k_cache = p.k.data();
    a.v_cache = p.v.data();
    a.k_dtype = a.v_dtype = DType::kInt4;
    a.kv_strides = strides;
    a.k_token_scales = p.ks.data();
    a.v_token_scales = p.vs.data();
    a.token_scale_strides = scale_strides;
    a.block_table = table.data();
    a.context_lens = lens.data();
    std::vector<float> out(std::size_t{H} * kD, std::numeric_limits<float>::quiet_NaN());
    a.out = out.data();
    decode(a, DecodeOptions{Backend::kCpu, 2});
    const ReferenceResult want = reference_decode(a);
    double err = 0, scale = 1e-30;
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i])) << i;
      err = std::max(err, std::fabs(out[i] - want.out[i]));
      scale = std::max(scale, std::fabs(want.out[i]));
    }
    EXPECT_LE(err / scale, testing::out_tolerance(DType::kF32));
    if (first.empty()) {
      first = out;
    } else {
      EXPECT_EQ(out, first) << "the same rows in another layout decode differently";
    }
  }
}

// copy_blocks of an int4 pool: codes and group scales of every row of the copied blocks, in a
// dense pool (one span a block) and a padded one (row by row); the other blocks untouched.
TEST(Int4Writes, CopyBlocksCarriesCodesAndGroupScales) {
  std::mt19937_64 rng(testing::seed_for(4900));
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const auto& [strides, scale_strides] : pool_layouts()) {
    SCOPED_TRACE("kv_strides.token " + std::to_string(strides.token));
    std::vector<float> key(std::size_t{2 * kBs} * kKv * kD), value(key.size());
    for (float& x : key) x = dist(rng);
    for (float& x : value) x = dist(rng) * 100.f;
    std::vector<std::int32_t> slots(2 * kBs);
    for (int t = 0; t < 2 * kBs; ++t) slots[t] = kBs + t;  // blocks 1 and 2
    Pool p(strides, scale_strides);
    write_cache(p.write_args(key, value, slots), kCpu);
    const Pool before = p;
    const BlockCopy pairs[] = {{1, 3}, {2, 0}};
    copy_blocks(p.copy_args(pairs, 2), kCpu);
    for (const BlockCopy& pair : pairs) {
      for (int kv = 0; kv < kKv; ++kv) {
        for (int t = 0; t < kBs; ++t) {
          for (bool is_k : {true, false}) {
            for (int d = 0; d < kD; ++d) {
              ASSERT_EQ(p.code(is_k, pair.dst * kBs + t, kv, d),
                        before.code(is_k, pair.src * kBs + t, kv, d));
            }
            for (int g = 0; g < kGroups; ++g) {
              EXPECT_EQ(p.scale(is_k, pair.dst * kBs + t, kv, g),
                        before.scale(is_k, pair.src * kBs + t, kv, g));
              EXPECT_GT(p.scale(is_k, pair.dst * kBs + t, kv, g), 0.f);
            }
          }
        }
      }
    }
    for (int kv = 0; kv < kKv; ++kv) {  // the sources as they were
      for (int t = 0; t < kBs; ++t) {
        EXPECT_EQ(p.scale(true, kBs + t, kv, 0), before.scale(true, kBs + t, kv, 0));
      }
    }
  }
}

// Decode of rows written into an int4 cache (and int8 with per-token scales, for comparison)
// against the decode of the same rows unquantized (written_decode_error): with one scale per group
// of 32, an outlier costs its own group's resolution only.
//
// One decode's max |error| / max |out| swings with the draw where a few outlier rows dominate the
// softmax (an outlier costs the other 31 values of its group their resolution, and shifts those
// rows' logits): over five draws each, the mean against int8's with per-token scales, and without
// the outliers a bound of the format's own.
TEST(Int4Writes, DecodeOfWrittenRowsIsWithinTheFormatsBound) {
  double int4_sum = 0, int8_sum = 0, plain_max = 0;
  for (std::uint64_t i = 0; i < 5; ++i) {
    const double int4 = written_decode_error(DType::kInt4, testing::seed_for(5000 + i));
    const double int8 = written_decode_error(DType::kInt8, testing::seed_for(5000 + i));
    const double plain = written_decode_error(DType::kInt4, testing::seed_for(5100 + i),
                                              /*token_scales=*/true, /*outliers=*/false);
    EXPECT_GT(int4, 0.0) << "no quantization error at all: the cache was not quantized";
    EXPECT_LE(plain, 0.3) << "draw " << i << ", no outliers";
    int4_sum += int4;
    int8_sum += int8;
    plain_max = std::max(plain_max, plain);
  }
  RecordProperty("int4_group_mean", std::to_string(int4_sum / 5));
  RecordProperty("int8_token_mean", std::to_string(int8_sum / 5));
  RecordProperty("int4_no_outliers_max", std::to_string(plain_max));
  EXPECT_LE(int4_sum / 5, 1.0);
  EXPECT_GT(int4_sum, int8_sum) << "4 bits more accurate than 8";
}

TEST(Int4Errors, CacheOpsNameTheArgument) {
  std::vector<float> key(std::size_t{kKv} * kD, 1.f), value(key.size(), 1.f);
  const std::vector<std::int32_t> slots = {5};
  Pool p;
  const std::vector<std::uint8_t> k_before = p.k;
  CacheWriteArgs a = p.write_args(key, value, slots);
  a.k_token_scales = a.v_token_scales = nullptr;
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kInvalidArgument, "k_token_scales",
               {"int4", "group scales"}, "an int4 write without scales");
  a = p.write_args(key, value, slots);
  a.src_dtype = DType::kInt4;
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kUnsupported, "src_dtype", {"int4"},
               "int4 source rows");
  a = p.write_args(key, value, slots);
  a.head_dim = 80;
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kUnsupported, "head_dim",
               {"80", "multiple of 32"}, "an int4 write at head dim 80");
  a = p.write_args(key, value, slots);
  a.kv_strides = CacheStrides{kKv * kBs * (kD + 1) + 2, kBs * (kD + 1) + 2, kD + 1};
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kInvalidArgument, "kv_strides.token",
               {"even"}, "an odd stride");
  a = p.write_args(key, value, slots);
  a.token_scale_strides = CacheStrides::hnd(kKv, kBs, 1);
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kInvalidArgument,
               "token_scale_strides.token", {"overlap"}, "scale rows of one float");
  EXPECT_EQ(p.k, k_before) << "a refused write wrote the cache";
  EXPECT_EQ(p.ks[0], -1.f) << "a refused write wrote a scale";
  const BlockCopy pair{0, 1};
  CopyBlocksArgs c = p.copy_args(&pair, 1);
  c.k_token_scales = c.v_token_scales = nullptr;
  expect_error([&] { copy_blocks(c, kCpu); }, ErrorCode::kInvalidArgument, "k_token_scales",
               {"int4"}, "an int4 copy without scales");
  c = p.copy_args(&pair, 1);
  c.kv_strides = CacheStrides::nhd(kKv, kBs, kD);
  c.kv_strides.head += 1;
  c.kv_strides.token = kKv * c.kv_strides.head;
  c.kv_strides.block = kBs * c.kv_strides.token;
  expect_error([&] { copy_blocks(c, kCpu); }, ErrorCode::kInvalidArgument, "kv_strides.head",
               {"even"}, "an odd stride");
}

}  // namespace
}  // namespace pagedattn
