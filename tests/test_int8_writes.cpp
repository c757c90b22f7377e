// Writing quantized caches with per-token scales (CacheWriteArgs::k_token_scales): each row's scale
// and codes by the definition in cache_ops.hpp, edge rows (zeros, NaN, Inf, huge values), NHD
// scale strides, a decode of written rows against the decode of the unquantized rows (the
// accuracy bounds docs/kv_quantization.md states), copy_blocks carrying the scales, and the
// argument errors of decode, write_cache and copy_blocks with per-token scales and int8; the CUDA
// backend's writes and copies against the CPU backend's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "quantized_write_cases.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

constexpr int kKv = 2, kD = 64, kBs = 8, kBlocks = 4;
constexpr CacheOpOptions kCpu{Backend::kCpu, 2};

// A pool of kBlocks blocks in `cache`, with per-token scale pools, and rows to write.
struct Pool {
  DType cache;
  std::vector<std::uint8_t> k, v;
  std::vector<float> ks, vs;  // [kBlocks][kKv][kBs]
  explicit Pool(DType c)
      : cache(c),
        k(std::size_t{kBlocks} * kKv * kBs * kD, 0),
        v(k.size(), 0),
        ks(std::size_t{kBlocks} * kKv * kBs, -1.f),
        vs(ks.size(), -1.f) {}
  CacheWriteArgs write_args(const std::vector<float>& key, const std::vector<float>& value,
                            const std::vector<std::int32_t>& slots) {
    auto a = testing::pool_args<CacheWriteArgs>(kKv, kD, kBs, kBlocks, k.data(), v.data(), cache);
    a.num_tokens = static_cast<int>(slots.size());
    a.key = key.data();
    a.value = value.data();
    a.slot_mapping = slots.data();
    a.k_token_scales = ks.data();
    a.v_token_scales = vs.data();
    return a;
  }
  // Copies block pair.src to pair.dst, scales included, in a cache read as `as`.
  CopyBlocksArgs copy_args(DType as, const BlockCopy& pair) {
    auto a = testing::pool_args<CopyBlocksArgs>(kKv, kD, kBs, kBlocks, k.data(), v.data(), as);
    a.pairs = &pair;
    a.num_pairs = 1;
    a.k_token_scales = ks.data();
    a.v_token_scales = vs.data();
    return a;
  }
};

// The scale and codes of one row by the definition: s = max finite |x| / (max code x head scale),
// clamped into [kMinKvScale, kMaxKvScale] (1 without a finite nonzero value); code = x / (head
// scale x s) rounded by the format's conversion.
void expect_row(const Pool& p, const float* x, int slot, int kv, float head, const char* which) {
  double amax = 0;
  for (int d = 0; d < kD; ++d) {
    if (std::isfinite(x[d])) amax = std::max(amax, std::fabs(double(x[d])));
  }
  double s = amax > 0 ? amax / (double(max_code_magnitude(p.cache)) * head) : 1.0;
  s = std::min(std::max(s, double(kMinKvScale)), double(kMaxKvScale));
  const std::size_t row = (std::size_t(slot / kBs) * kKv + kv) * kBs + slot % kBs;
  const float got_s = (which[0] == 'k' ? p.ks : p.vs)[row];
  EXPECT_EQ(got_s, static_cast<float>(s)) << which << " slot " << slot << " kv " << kv;
  const std::uint8_t* codes = (which[0] == 'k' ? p.k : p.v).data() + row * kD;
  for (int d = 0; d < kD; ++d) {
    const float want = round_to(p.cache, x[d] / (head * got_s));
    const float got = load_as_float(codes, p.cache, d);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << which << " slot " << slot << " d " << d;
    } else {
      EXPECT_EQ(got, want) << which << " slot " << slot << " kv " << kv << " d " << d << " x "
                           << x[d];
    }
  }
}

// K and V rows of `tokens` tokens drawn from dist (V at a thousandth of K's scale), with edge
// rows: token 1's K all zero; token 2's K with NaN and Inf; token 3's V huge.
void edge_rows(int tokens, std::mt19937_64& rng, std::normal_distribution<float>& dist,
               std::vector<float>& key, std::vector<float>& value) {
  key.assign(static_cast<std::size_t>(tokens) * kKv * kD, 0.f);
  value.assign(key.size(), 0.f);
  for (float& x : key) x = dist(rng);
  for (float& x : value) x = dist(rng) * 1e-3f;
  std::fill(key.begin() + kKv * kD, key.begin() + kKv * kD + kD, 0.f);
  key[2 * kKv * kD + 3] = std::numeric_limits<float>::quiet_NaN();
  key[2 * kKv * kD + 5] = INFINITY;
  for (int d = 0; d < kD; ++d) value[3 * kKv * kD + d] = 1e36f * (d % 2 ? 1 : -1);
}

TEST(Int8Writes, TokenScalesAndCodesByTheDefinition) {
  std::mt19937_64 rng(testing::seed_for(1400));
  std::normal_distribution<float> dist(0.f, 3.f);
  for (DType cache : {DType::kInt8, DType::kFP8E4M3, DType::kFP8E5M2}) {
    SCOPED_TRACE(dtype_name(cache));
    const int tokens = 6;
    std::vector<float> key, value;
    edge_rows(tokens, rng, dist, key, value);
    const std::vector<std::int32_t> slots = {0, 9, -1, 31, 17, 4};
    std::vector<float> k_heads = {0.5f, 2.f}, v_heads = {1.f, 0.25f};
    Pool p(cache);
    CacheWriteArgs a = p.write_args(key, value, slots);
    a.k_scale = 0.5f;
    a.k_scales = k_heads.data();
    a.v_scales = v_heads.data();
    write_cache(a, kCpu);
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int kv = 0; kv < kKv; ++kv) {
        const std::size_t src = (std::size_t(t) * kKv + kv) * kD;
        expect_row(p, &key[src], slots[t], kv, 0.5f * k_heads[kv], "k");
        expect_row(p, &value[src], slots[t], kv, v_heads[kv], "v");
      }
    }
    EXPECT_EQ(p.ks[2 * kBs + 0], -1.f) << "a skipped token's scale was written";
  }
}

// Decode of rows written with per-token scales, against the decode of the same rows unquantized:
// the error a format adds. Rows with outliers (one channel 20x the others) show what per-token
// scales buy over one scale for the whole tensor.
TEST(Int8Writes, DecodeOfWrittenRowsIsWithinTheFormatsBounds) {
  const double int8_token = written_decode_error(DType::kInt8, testing::seed_for(1500));
  const double int8_tensor = written_decode_error(DType::kInt8, testing::seed_for(1501), false);
  const double e4m3_token = written_decode_error(DType::kFP8E4M3, testing::seed_for(1502));
  const double e4m3_tensor = written_decode_error(DType::kFP8E4M3, testing::seed_for(1503), false);
  RecordProperty("int8_token", std::to_string(int8_token));
  RecordProperty("int8_tensor", std::to_string(int8_tensor));
  RecordProperty("e4m3_token", std::to_string(e4m3_token));
  RecordProperty("e4m3_tensor", std::to_string(e4m3_tensor));
  EXPECT_LE(int8_token, 5e-2);
  EXPECT_LE(e4m3_token, 5e-2);
  // The outlier channel costs a per-tensor scale most of its resolution.
  EXPECT_LT(2 * int8_token, int8_tensor);
  EXPECT_LT(2 * e4m3_token, e4m3_tensor);
  EXPECT_GT(int8_token, 0.0) << "no quantization error at all: the cache was not quantized";
}

// A small int8 case with per-token scales (bad_input_spec's shape).
testing::HostCase int8_case() {
  testing::CaseSpec spec = bad_input_spec();
  spec.kv_dtype = DType::kInt8;
  spec.k_scale = spec.v_scale = 0.02f;
  spec.token_scales = true;
  return testing::make_case(spec);
}

void expect_decode_error(testing::HostCase& c, const DecodeArgs& a, ErrorCode code,
                         const std::string& argument, const std::vector<std::string>& parts) {
  const Unwritten before(c);
  expect_error(
      [&] {
        decode(a, DecodeOptions{Backend::kCpu, 2});
      },
      code, argument, parts, "decode with a bad " + argument);
  before.check();
}

TEST(Int8Errors, DecodeNamesTheArgument) {
  testing::HostCase c = int8_case();
  DecodeArgs a = c.args();
  a.v_token_scales = nullptr;
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "v_token_scales", {"pairs"});
  a = c.args();
  a.k_dtype = a.v_dtype = DType::kBF16;
  a.k_scale = a.v_scale = 1.f;
  expect_decode_error(c, a, ErrorCode::kUnsupported, "k_token_scales", {"quantized", "bf16"});
  a = c.args();
  a.k_token_scales = a.v_token_scales = nullptr;
  a.token_scale_strides = CacheStrides::nhd(2, 8, 1);
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "token_scale_strides.block",
                      {"without per-token scales"});
  a = c.args();
  a.token_scale_strides = CacheStrides{16, 8, 0};
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "token_scale_strides.token", {"positive"});
  a = c.args();
  a.token_scale_strides = CacheStrides{16, 1, 1};  // rows of kv heads 0 and 1 overlap
  expect_decode_error(c, a, ErrorCode::kInvalidArgument, "token_scale_strides.head", {"overlap"});
  a = c.args();
  a.q_dtype = DType::kInt8;
  expect_decode_error(c, a, ErrorCode::kUnsupported, "q_dtype", {"int8", "caches only"});
  // A read row's scale out of range names the row; a NaN scale in a slot past the context does
  // not matter (make_case poisons those).
  const int id = c.block_table[0];
  const std::size_t row = (static_cast<std::size_t>(id) * 2 + 1) * 8 + 3;  // kv head 1, slot 3
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), 0.f, -1.f, 1e31f}) {
    c.v_token_scales[row] = bad;
    expect_decode_error(c, c.args(), ErrorCode::kInvalidArgument,
                        "v_token_scales[block " + std::to_string(id) + ", kv head 1, slot 3]",
                        {"must be in"});
  }
}

TEST(Int8Errors, CacheOpsNameTheArgument) {
  std::vector<float> key(std::size_t{kKv} * kD, 1.f), value(key.size(), 1.f);
  const std::vector<std::int32_t> slots = {5};
  Pool p(DType::kF16);
  CacheWriteArgs a = p.write_args(key, value, slots);
  const std::vector<std::uint8_t> k_before = p.k;
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kUnsupported, "k_token_scales",
               {"quantized"}, "per-token scales on an f16 cache");
  a.cache_dtype = DType::kInt8;
  a.v_token_scales = nullptr;
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kInvalidArgument, "v_token_scales",
               {"pairs"}, "one per-token scale pool");
  a = p.write_args(key, value, slots);
  a.cache_dtype = DType::kInt8;
  a.src_dtype = DType::kInt8;
  expect_error([&] { write_cache(a, kCpu); }, ErrorCode::kUnsupported, "src_dtype", {"int8"},
               "int8 source rows");
  EXPECT_EQ(p.k, k_before) << "a refused write wrote the cache";
  EXPECT_EQ(p.ks[5], -1.f) << "a refused write wrote a scale";
  const BlockCopy pair{0, 1};
  expect_error([&] { copy_blocks(p.copy_args(DType::kBF16, pair), kCpu); }, ErrorCode::kUnsupported,
               "k_token_scales", {"quantized"}, "copying per-token scales of a bf16 cache");
}

TEST(Int8Writes, CopyBlocksCarriesTheScales) {
  std::mt19937_64 rng(testing::seed_for(1600));
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> key(std::size_t{kBs} * kKv * kD), value(key.size());
  for (float& x : key) x = dist(rng);
  for (float& x : value) x = dist(rng);
  std::vector<std::int32_t> slots(kBs);
  for (int t = 0; t < kBs; ++t) slots[t] = kBs + t;  // block 1
  Pool p(DType::kInt8);
  write_cache(p.write_args(key, value, slots), kCpu);
  const BlockCopy pair{1, 3};
  copy_blocks(p.copy_args(DType::kInt8, pair), kCpu);
  const std::size_t block = std::size_t{kKv} * kBs;
  for (std::size_t i = 0; i < block; ++i) {
    EXPECT_EQ(p.ks[3 * block + i], p.ks[block + i]) << i;
    EXPECT_EQ(p.vs[3 * block + i], p.vs[block + i]) << i;
    EXPECT_GT(p.ks[block + i], 0.f) << i;
  }
  EXPECT_EQ(p.ks[0], -1.f) << "a block outside the copy changed";
}

// write_cache and copy_blocks with per-token scales on CUDA give the CPU backend's bits: codes and
// scales, edge rows included (zeros, NaN and Inf among finite values, huge values).
TEST(Int8Writes, CudaWritesAndCopiesTheCpuBits) {
  if (!cuda_available() || !testing::device_memory_built()) GTEST_SKIP() << "no CUDA device";
  using testing::DeviceBuffer;
  std::mt19937_64 rng(testing::seed_for(1700));
  std::normal_distribution<float> dist(0.f, 3.f);
  for (DType cache : {DType::kInt8, DType::kFP8E4M3, DType::kFP8E5M2}) {
    SCOPED_TRACE(dtype_name(cache));
    std::vector<float> key, value;
    edge_rows(6, rng, dist, key, value);
    const std::vector<std::int32_t> slots = {0, 9, -1, 31, 17, 4};
    std::vector<float> k_heads = {0.5f, 2.f};
    Pool want(cache), got(cache);
    CacheWriteArgs a = want.write_args(key, value, slots);
    a.k_scales = k_heads.data();
    write_cache(a, kCpu);
    const BlockCopy pair{1, 2};
    copy_blocks(want.copy_args(cache, pair), kCpu);

    DeviceBuffer dkey(key.data(), key.size() * 4), dvalue(value.data(), value.size() * 4);
    DeviceBuffer dslots(slots.data(), slots.size() * 4), dheads(k_heads.data(), 8);
    DeviceBuffer k(got.k.data(), got.k.size()), v(got.v.data(), got.v.size());
    DeviceBuffer ks(got.ks.data(), got.ks.size() * 4), vs(got.vs.data(), got.vs.size() * 4);
    CacheWriteArgs d = got.write_args(key, value, slots);
    d.key = dkey.get();
    d.value = dvalue.get();
    d.slot_mapping = dslots.as<const std::int32_t>();
    d.k_scales = dheads.as<const float>();
    d.k_cache = k.get();
    d.v_cache = v.get();
    d.k_token_scales = ks.as<float>();
    d.v_token_scales = vs.as<float>();
    CacheOpOptions o;
    o.backend = Backend::kCuda;
    o.cuda_checked = cache == DType::kInt8;
    write_cache(d, o);
    CopyBlocksArgs c = got.copy_args(cache, pair);
    c.k_cache = k.get();
    c.v_cache = v.get();
    c.k_token_scales = ks.as<float>();
    c.v_token_scales = vs.as<float>();
    copy_blocks(c, o);
    k.to_host(got.k);
    v.to_host(got.v);
    ks.to_host(got.ks);
    vs.to_host(got.vs);
    EXPECT_EQ(got.k, want.k);
    EXPECT_EQ(got.v, want.v);
    EXPECT_EQ(0, std::memcmp(got.ks.data(), want.ks.data(), got.ks.size() * 4));
    EXPECT_EQ(0, std::memcmp(got.vs.data(), want.vs.data(), got.vs.size() * 4));
  }
}

}  // namespace
}  // namespace pagedattn
