// Cache writes and block copies against a plain element-by-element reference, on the CPU backend
// and (where a device is present) the CUDA backend; out-of-range slots and block ids are errors
// that leave the cache untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bad_input.hpp"
#include "gtest_printers.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/device_memory.hpp"

namespace pagedattn {
namespace {

struct WriteCase {
  int num_tokens, num_kv_heads, head_dim, block_size, num_blocks;
  DType src, cache;
  std::int64_t src_stride;
  std::vector<std::uint8_t> key, value, k_cache, v_cache;
  std::vector<std::int32_t> slots;
  float k_scale = 1.f, v_scale = 1.f;     // fp8 caches only
  std::vector<float> k_scales, v_scales;  // per kv head, or empty

  CacheWriteArgs args() {
    CacheWriteArgs a = testing::pool_args<CacheWriteArgs>(
        num_kv_heads, head_dim, block_size, num_blocks, k_cache.data(), v_cache.data(), cache);
    a.num_tokens = num_tokens;
    a.key = key.data();
    a.value = value.data();
    a.src_dtype = src;
    a.src_token_stride = src_stride;
    a.slot_mapping = slots.data();
    a.k_scale = k_scale;
    a.v_scale = v_scale;
    a.k_scales = k_scales.empty() ? nullptr : k_scales.data();
    a.v_scales = v_scales.empty() ? nullptr : v_scales.data();
    return a;
  }
};

// Distinct random slots, about one in five skipped; sources random, caches a byte pattern.
WriteCase make_write_case(int tokens, int kv, int dim, int bs, int blocks, DType src, DType cache,
                          std::int64_t extra_stride, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  WriteCase c{tokens, kv, dim, bs, blocks, src, cache, 0, {}, {}, {}, {}, {}};
  c.src_stride = extra_stride ? static_cast<std::int64_t>(kv) * dim + extra_stride : 0;
  const std::int64_t row = c.src_stride ? c.src_stride : static_cast<std::int64_t>(kv) * dim;
  const std::size_t src_elems = static_cast<std::size_t>(row) * tokens;
  c.key.resize(src_elems * dtype_size(src));
  c.value.resize(src_elems * dtype_size(src));
  std::normal_distribution<float> normal(0.f, 2.f);
  for (std::size_t i = 0; i < src_elems; ++i) {
    store_from_float(c.key.data(), src, i, normal(rng));
    store_from_float(c.value.data(), src, i, normal(rng));
  }
  if (is_quantized(cache)) {
    // Scaled codes, and the edges of quantizing: NaN, Inf, beyond the range (saturates), below
    // the smallest subnormal (to 0).
    c.k_scale = 0.25f;
    c.v_scale = 4.f;
    const float edges[] = {NAN,   INFINITY,      -INFINITY, 1e6f,  -1e6f,
                           1e-9f, 448.f * 0.25f, 500.f,     3e38f, -3e38f};
    for (std::size_t i = 0; i < std::size(edges) && i < src_elems; ++i) {
      store_from_float(c.key.data(), src, i, edges[i]);
      store_from_float(c.value.data(), src, src_elems - 1 - i, edges[i]);
    }
  }
  const std::size_t cache_bytes =
      static_cast<std::size_t>(CacheLayout::dense(blocks, kv, bs, dim).elements()) *
      dtype_size(cache);
  c.k_cache.resize(cache_bytes);
  c.v_cache.resize(cache_bytes);
  for (std::size_t i = 0; i < cache_bytes; ++i) {
    c.k_cache[i] = static_cast<std::uint8_t>(i * 7 + 1);
    c.v_cache[i] = static_cast<std::uint8_t>(i * 13 + 5);
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(blocks) * bs);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  for (int t = 0; t < tokens; ++t) c.slots.push_back(rng() % 5 == 0 ? -1 : all[t]);
  return c;
}

// The reference: one element at a time through f32.
void reference_write(WriteCase& c) {
  const CacheLayout l = CacheLayout::dense(c.num_blocks, c.num_kv_heads, c.block_size, c.head_dim);
  const std::int64_t row = c.src_stride ? c.src_stride : std::int64_t{c.num_kv_heads} * c.head_dim;
  for (int t = 0; t < c.num_tokens; ++t) {
    const int s = c.slots[t];
    if (s < 0) continue;
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (int d = 0; d < c.head_dim; ++d) {
        const std::size_t src = t * row + h * c.head_dim + d;
        const std::size_t dst = l.offset(s / c.block_size, h, s % c.block_size) + d;
        // A quantized cache holds x / scale (a scale of 1 leaves the other dtypes' values alone).
        const float ks = c.k_scale * (c.k_scales.empty() ? 1.f : c.k_scales[h]);
        const float vs = c.v_scale * (c.v_scales.empty() ? 1.f : c.v_scales[h]);
        const auto put = [&](std::vector<std::uint8_t>& cache, float x, float scale) {
          float q = x / scale;
          // A finite value whose quotient overflows still saturates (docs/fp8.md).
          if (std::isfinite(x) && std::isinf(q)) q = std::copysign(FLT_MAX, q);
          store_from_float(cache.data(), c.cache, dst, is_quantized(c.cache) ? q : x);
        };
        put(c.k_cache, load_as_float(c.key.data(), c.src, src), ks);
        put(c.v_cache, load_as_float(c.value.data(), c.src, src), vs);
      }
    }
  }
}

CacheOpOptions cpu() {
  CacheOpOptions o;
  o.backend = Backend::kCpu;
  return o;
}

using DTypePair = std::tuple<DType, DType>;
class CacheWriteDTypes : public ::testing::TestWithParam<DTypePair> {};

TEST_P(CacheWriteDTypes, CpuMatchesTheReference) {
  const auto [src, cache] = GetParam();
  int seed = 1;
  for (const int bs : {1, 5, 16}) {
    for (const int dim : {64, 80, 512}) {
      for (const int tokens : {1, 7, 200}) {
        SCOPED_TRACE(::testing::Message() << "bs=" << bs << " dim=" << dim << " tokens=" << tokens);
        WriteCase got = make_write_case(tokens, 2, dim, bs, (tokens + bs) / bs + 2, src, cache,
                                        seed % 2 ? 0 : 24, seed);
        WriteCase want = got;
        ++seed;
        write_cache(got.args(), cpu());
        reference_write(want);
        EXPECT_TRUE(got.k_cache == want.k_cache);
        EXPECT_TRUE(got.v_cache == want.v_cache);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, CacheWriteDTypes,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3,
                                         DType::kFP8E5M2, DType::kInt8)),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
             dtype_name(std::get<1>(info.param));
    });

TEST(CacheWrite, Fp8PerHeadScales) {
  for (const DType cache : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    WriteCase got = make_write_case(40, 3, 64, 16, 6, DType::kBF16, cache, 0, 21);
    got.k_scales = {0.5f, 1.f, 8.f};
    got.v_scales = {2.f, 0.125f, 1.f};
    WriteCase want = got;
    write_cache(got.args(), cpu());
    reference_write(want);
    EXPECT_TRUE(got.k_cache == want.k_cache) << dtype_name(cache);
    EXPECT_TRUE(got.v_cache == want.v_cache) << dtype_name(cache);
  }
  // Scales on other caches, out of range, or from fp8 sources are errors.
  WriteCase c = make_write_case(4, 2, 64, 16, 2, DType::kF32, DType::kBF16, 0, 2);
  CacheWriteArgs a = c.args();
  a.k_scale = 2.f;
  EXPECT_THROW(write_cache(a, cpu()), Error);
  WriteCase f = make_write_case(4, 2, 64, 16, 2, DType::kF32, DType::kFP8E4M3, 0, 2);
  f.v_scales = {1.f, 0.f};
  try {
    write_cache(f.args(), cpu());
    ADD_FAILURE() << "v_scales[1] = 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "v_scales[1]");
  }
  a = f.args();
  a.v_scales = nullptr;
  a.src_dtype = DType::kFP8E5M2;
  try {
    write_cache(a, cpu());
    ADD_FAILURE() << "an fp8 source accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "src_dtype");
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

TEST(CacheWrite, SlotOutOfRangeIsAnErrorAndWritesNothing) {
  for (const std::int32_t bad : {-2, 4 * 16, 1 << 30}) {
    WriteCase c = make_write_case(8, 2, 64, 16, 4, DType::kF32, DType::kBF16, 0, 3);
    c.slots[5] = bad;
    const std::vector<std::uint8_t> k0 = c.k_cache, v0 = c.v_cache;
    try {
      write_cache(c.args(), cpu());
      FAIL() << "slot " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
      EXPECT_EQ(e.argument(), "slot_mapping[5]");
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
    EXPECT_TRUE(c.k_cache == k0);
    EXPECT_TRUE(c.v_cache == v0);
  }
}

TEST(CacheWrite, BadShapesAreErrors) {
  WriteCase c = make_write_case(4, 2, 64, 16, 4, DType::kF32, DType::kF32, 0, 4);
  CacheWriteArgs a = c.args();
  a.block_size = 0;
  EXPECT_THROW(write_cache(a, cpu()), Error);
  a = c.args();
  a.key = nullptr;
  EXPECT_THROW(write_cache(a, cpu()), Error);
  a = c.args();
  a.src_token_stride = 10;
  EXPECT_THROW(write_cache(a, cpu()), Error);
  a = c.args();
  a.num_tokens = 0;
  a.key = nullptr;  // nothing to read: fine
  EXPECT_NO_THROW(write_cache(a, cpu()));
}

// Runs write_cache on a mutated case; expects an Error with `code` naming `argument` whose
// message holds each of `parts`, and both caches untouched.
void expect_write_rejected(
    const std::function<void(WriteCase&, CacheWriteArgs&, CacheOpOptions&)>& mutate, ErrorCode code,
    const std::string& argument, const std::vector<std::string>& parts) {
  WriteCase c = make_write_case(12, 2, 64, 4, 8, DType::kF32, DType::kBF16, 0, 21);
  CacheWriteArgs a = c.args();
  CacheOpOptions o = cpu();
  mutate(c, a, o);
  const std::vector<std::uint8_t> k0 = c.k_cache, v0 = c.v_cache;
  expect_error([&] { write_cache(a, o); }, code, argument, parts,
               "write_cache with a bad " + argument);
  EXPECT_TRUE(c.k_cache == k0) << "k_cache written despite the error";
  EXPECT_TRUE(c.v_cache == v0) << "v_cache written despite the error";
}

TEST(CacheWrite, DuplicateSlotsAreAnErrorAndWriteNothing) {
  // Token 9 repeats token 2's slot; token 11 repeats token 4's, later: token 9 is named.
  expect_write_rejected(
      [](WriteCase& c, CacheWriteArgs&, CacheOpOptions&) {
        c.slots[2] = 17;
        c.slots[9] = 17;
        c.slots[4] = 30;
        c.slots[11] = 30;
        for (int i : {0, 1, 3, 5, 6, 7, 8, 10}) c.slots[i] = i == 5 ? -1 : 18 + i;
      },
      ErrorCode::kInvalidArgument, "slot_mapping[9]",
      {"slot_mapping[9] = 17", "slot_mapping[2]", "distinct"});
  // Three tokens in one slot: the second is named, against the first.
  expect_write_rejected(
      [](WriteCase& c, CacheWriteArgs&, CacheOpOptions&) {
        for (int i = 0; i < 12; ++i) c.slots[i] = -1;
        c.slots[1] = c.slots[6] = c.slots[3] = 0;
      },
      ErrorCode::kInvalidArgument, "slot_mapping[3]", {"slot_mapping[3] = 0", "slot_mapping[1]"});
}

TEST(CacheWrite, SkippedSlotsMayRepeat) {
  WriteCase got = make_write_case(12, 2, 64, 4, 8, DType::kF32, DType::kF16, 0, 22);
  for (int i = 0; i < 12; i += 2) got.slots[i] = -1;
  WriteCase want = got;
  write_cache(got.args(), cpu());
  reference_write(want);
  EXPECT_TRUE(got.k_cache == want.k_cache);
  EXPECT_TRUE(got.v_cache == want.v_cache);
}

TEST(CacheWrite, HeadDimsDecodeRefusesAreErrors) {
  for (const int dim : {1, 32, 100, 384, 1024}) {
    SCOPED_TRACE(dim);
    expect_write_rejected(
        [dim](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.head_dim = dim; },
        ErrorCode::kUnsupported, "head_dim",
        {"head_dim = " + std::to_string(dim), "unsupported", "64, 80"});
  }
  expect_write_rejected([](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.head_dim = 0; },
                        ErrorCode::kUnsupported, "head_dim", {"head_dim = 0"});
}

TEST(CacheWrite, EveryFieldIsChecked) {
  using M = std::function<void(WriteCase&, CacheWriteArgs&, CacheOpOptions&)>;
  const struct {
    M mutate;
    ErrorCode code;
    std::string argument;
    std::string part;
  } cases[] = {
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.num_tokens = -1; },
       ErrorCode::kInvalidArgument, "num_tokens", "num_tokens = -1"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.num_kv_heads = 0; },
       ErrorCode::kInvalidArgument, "num_kv_heads", "num_kv_heads = 0"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.block_size = 257; },
       ErrorCode::kUnsupported, "block_size", "block_size = 257"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.num_blocks = -3; },
       ErrorCode::kInvalidArgument, "num_blocks", "num_blocks = -3"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.src_dtype = static_cast<DType>(16); },
       ErrorCode::kInvalidArgument, "src_dtype", "not a DType"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) {
         a.cache_dtype = static_cast<DType>(-1);
       },
       ErrorCode::kInvalidArgument, "cache_dtype", "not a DType"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.src_token_stride = -128; },
       ErrorCode::kInvalidArgument, "src_token_stride", "src_token_stride = -128"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.value = nullptr; },
       ErrorCode::kInvalidArgument, "value", "value = null"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.slot_mapping = nullptr; },
       ErrorCode::kInvalidArgument, "slot_mapping", "slot_mapping = null"},
      {[](WriteCase&, CacheWriteArgs& a, CacheOpOptions&) { a.v_cache = nullptr; },
       ErrorCode::kInvalidArgument, "v_cache", "v_cache = null"},
      {[](WriteCase&, CacheWriteArgs&, CacheOpOptions& o) { o.num_threads = -2; },
       ErrorCode::kInvalidArgument, "num_threads", "num_threads = -2"},
      {[](WriteCase&, CacheWriteArgs&, CacheOpOptions& o) { o.num_threads = kMaxThreads + 1; },
       ErrorCode::kInvalidArgument, "num_threads", "[0, 4096]"},
      {[](WriteCase&, CacheWriteArgs&, CacheOpOptions& o) { o.backend = static_cast<Backend>(9); },
       ErrorCode::kInvalidArgument, "backend", "not a Backend"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.argument);
    expect_write_rejected(c.mutate, c.code, c.argument, {c.part});
  }
}

struct CopyCase {
  std::vector<std::uint8_t> k, v;
  std::int64_t block_bytes;
};

CopyBlocksArgs copy_args(CopyCase& c, const std::vector<BlockCopy>& pairs, DType t) {
  // 2 kv heads, head_dim 64, blocks of 4 slots, 8 blocks (make_copy_case's sizes).
  CopyBlocksArgs a = testing::pool_args<CopyBlocksArgs>(2, 64, 4, 8, c.k.data(), c.v.data(), t);
  a.pairs = pairs.data();
  a.num_pairs = static_cast<int>(pairs.size());
  return a;
}

CopyCase make_copy_case(DType t) {
  CopyCase c;
  c.block_bytes = 2 * 64 * 4 * static_cast<std::int64_t>(dtype_size(t));
  c.k.resize(8 * c.block_bytes);
  c.v.resize(8 * c.block_bytes);
  for (std::size_t i = 0; i < c.k.size(); ++i) {
    c.k[i] = static_cast<std::uint8_t>(i * 31 + 3);
    c.v[i] = static_cast<std::uint8_t>(i * 17 + 9);
  }
  return c;
}

void reference_copy(CopyCase& c, const std::vector<BlockCopy>& pairs) {
  for (const BlockCopy& p : pairs) {
    std::memcpy(&c.k[p.dst * c.block_bytes], &c.k[p.src * c.block_bytes], c.block_bytes);
    std::memcpy(&c.v[p.dst * c.block_bytes], &c.v[p.src * c.block_bytes], c.block_bytes);
  }
}

TEST(CopyBlocks, CpuMatchesTheReference) {
  for (const DType t : {DType::kF32, DType::kBF16}) {
    CopyCase got = make_copy_case(t);
    CopyCase want = got;
    const std::vector<BlockCopy> pairs = {{0, 5}, {3, 1}, {0, 7}};
    copy_blocks(copy_args(got, pairs, t), cpu());
    reference_copy(want, pairs);
    EXPECT_TRUE(got.k == want.k);
    EXPECT_TRUE(got.v == want.v);
  }
}

TEST(CopyBlocks, BadPairsAreErrorsAndCopyNothing) {
  CopyCase c = make_copy_case(DType::kF32);
  const CopyCase before = c;
  const auto expect_error = [&](const std::vector<BlockCopy>& pairs, const std::string& arg) {
    try {
      copy_blocks(copy_args(c, pairs, DType::kF32), cpu());
      ADD_FAILURE() << "accepted, expected an error about " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
    EXPECT_TRUE(c.k == before.k && c.v == before.v);
  };
  expect_error({{0, 1}, {8, 2}}, "pairs[1].src");
  expect_error({{0, 1}, {2, -1}}, "pairs[1].dst");
  expect_error({{0, 1}, {2, 1}}, "pairs[1].dst");  // written twice
  expect_error({{0, 1}, {1, 2}}, "pairs[0].dst");  // written while another pair reads it
}

TEST(CopyBlocks, BadShapesAndOptionsAreErrorsAndCopyNothing) {
  CopyCase c = make_copy_case(DType::kF32);
  const CopyCase before = c;
  const std::vector<BlockCopy> pairs = {{0, 5}};
  const auto expect_copy_error =
      [&](const std::function<void(CopyBlocksArgs&, CacheOpOptions&)>& mutate, ErrorCode code,
          const std::string& arg, const std::string& part) {
        CopyBlocksArgs a = copy_args(c, pairs, DType::kF32);
        CacheOpOptions o = cpu();
        mutate(a, o);
        expect_error([&] { copy_blocks(a, o); }, code, arg, {part},
                     "copy_blocks with a bad " + arg);
        EXPECT_TRUE(c.k == before.k && c.v == before.v);
      };
  expect_copy_error([](CopyBlocksArgs& a, CacheOpOptions&) { a.head_dim = 100; },
                    ErrorCode::kUnsupported, "head_dim", "head_dim = 100");
  expect_copy_error([](CopyBlocksArgs& a, CacheOpOptions&) { a.num_pairs = -1; },
                    ErrorCode::kInvalidArgument, "num_pairs", "num_pairs = -1");
  expect_copy_error(
      [](CopyBlocksArgs& a, CacheOpOptions&) { a.cache_dtype = static_cast<DType>(9); },
      ErrorCode::kInvalidArgument, "cache_dtype", "not a DType");
  expect_copy_error([](CopyBlocksArgs& a, CacheOpOptions&) { a.pairs = nullptr; },
                    ErrorCode::kInvalidArgument, "pairs", "pairs = null");
  expect_copy_error([](CopyBlocksArgs&, CacheOpOptions& o) { o.num_threads = -1; },
                    ErrorCode::kInvalidArgument, "num_threads", "num_threads = -1");
  expect_copy_error(
      [](CopyBlocksArgs&, CacheOpOptions& o) { o.backend = static_cast<Backend>(-4); },
      ErrorCode::kInvalidArgument, "backend", "not a Backend");
}

TEST(CacheWrite, CudaUnavailableIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  WriteCase c = make_write_case(4, 2, 64, 16, 4, DType::kF32, DType::kF32, 0, 5);
  CacheOpOptions o;
  o.backend = Backend::kCuda;
  try {
    write_cache(c.args(), o);
    FAIL() << "CUDA accepted without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackendUnavailable);
  }
}

using testing::DeviceBuffer;

CacheWriteArgs device_args(WriteCase& c, DeviceBuffer& key, DeviceBuffer& value,
                           DeviceBuffer& slots, DeviceBuffer& k, DeviceBuffer& v) {
  CacheWriteArgs a = c.args();
  a.key = key.get();
  a.value = value.get();
  a.slot_mapping = slots.as<const std::int32_t>();
  a.k_cache = k.get();
  a.v_cache = v.get();
  return a;
}

TEST_P(CacheWriteDTypes, CudaMatchesTheReference) {
  if (!cuda_available() || !testing::device_memory_built()) GTEST_SKIP() << "no CUDA device";
  const auto [src, cache] = GetParam();
  for (const bool checked : {true, false}) {
    WriteCase got = make_write_case(300, 4, 128, 16, 24, src, cache, checked ? 0 : 8, 11);
    WriteCase want = got;
    DeviceBuffer key(got.key.data(), got.key.size()), value(got.value.data(), got.value.size());
    DeviceBuffer slots(got.slots.data(), got.slots.size() * 4);
    DeviceBuffer k(got.k_cache.data(), got.k_cache.size()),
        v(got.v_cache.data(), got.v_cache.size());
    CacheOpOptions o;
    o.backend = Backend::kCuda;
    o.cuda_checked = checked;
    write_cache(device_args(got, key, value, slots, k, v), o);
    k.to_host(got.k_cache);
    v.to_host(got.v_cache);
    reference_write(want);
    EXPECT_TRUE(got.k_cache == want.k_cache) << "checked=" << checked;
    EXPECT_TRUE(got.v_cache == want.v_cache) << "checked=" << checked;
  }
}

TEST(CacheWrite, CudaSlotOutOfRange) {
  if (!cuda_available() || !testing::device_memory_built()) GTEST_SKIP() << "no CUDA device";
  WriteCase c = make_write_case(8, 2, 64, 16, 4, DType::kF32, DType::kF16, 0, 6);
  c.slots[2] = 4 * 16;
  WriteCase want = c;
  DeviceBuffer key(c.key.data(), c.key.size()), value(c.value.data(), c.value.size());
  DeviceBuffer slots(c.slots.data(), c.slots.size() * 4);
  DeviceBuffer k(c.k_cache.data(), c.k_cache.size()), v(c.v_cache.data(), c.v_cache.size());
  CacheOpOptions o;
  o.backend = Backend::kCuda;
  o.cuda_checked = true;
  try {  // checked: an error, nothing written
    write_cache(device_args(c, key, value, slots, k, v), o);
    FAIL() << "out-of-range slot accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "slot_mapping[2]");
  }
  std::vector<std::uint8_t> out(c.k_cache.size());
  k.to_host(out);
  EXPECT_TRUE(out == c.k_cache);
  // Unchecked: the kernel skips the bad slot and writes the others.
  o.cuda_checked = false;
  write_cache(device_args(c, key, value, slots, k, v), o);
  want.slots[2] = -1;
  reference_write(want);
  k.to_host(out);
  EXPECT_TRUE(out == want.k_cache);
  v.to_host(out);
  EXPECT_TRUE(out == want.v_cache);
}

TEST(CopyBlocks, CudaMatchesTheReference) {
  if (!cuda_available() || !testing::device_memory_built()) GTEST_SKIP() << "no CUDA device";
  for (const DType t : {DType::kF32, DType::kF16}) {
    CopyCase got = make_copy_case(t);
    CopyCase want = got;
    DeviceBuffer k(got.k.data(), got.k.size()), v(got.v.data(), got.v.size());
    std::vector<BlockCopy> pairs;
    for (int i = 0; i < 4; ++i) pairs.push_back({i, 7 - i});
    CopyBlocksArgs a = copy_args(got, pairs, t);
    a.k_cache = k.get();
    a.v_cache = v.get();
    CacheOpOptions o;
    o.backend = Backend::kCuda;
    copy_blocks(a, o);
    k.to_host(got.k);
    v.to_host(got.v);
    reference_copy(want, pairs);
    EXPECT_TRUE(got.k == want.k);
    EXPECT_TRUE(got.v == want.v);
  }
}
}  // namespace
}  // namespace pagedattn
