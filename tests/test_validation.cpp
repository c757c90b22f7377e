// Every bad input of DESIGN.md: a typed error naming the argument and the value, and nothing
// written to out or lse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "reference_check.hpp"

namespace pagedattn {
namespace {

// Runs decode with a mutation applied; expects an Error with `code`, whose argument() is
// `argument` and whose message contains each of `parts`; out and lse must stay untouched.
void expect_rejected(const std::function<void(DecodeArgs&, testing::HostCase&)>& mutate,
                     ErrorCode code, const std::string& argument,
                     const std::vector<std::string>& parts, Backend backend = Backend::kCpu) {
  testing::HostCase c = small_case();
  DecodeArgs a = c.args();
  mutate(a, c);
  const Unwritten unwritten(c);
  DecodeOptions o;
  o.backend = backend;
  expect_error([&] { decode(a, o); }, code, argument, parts, "decode with a bad " + argument);
  unwritten.check();
  // The reference validates its inputs the same way (it knows no backends and writes no out).
  if (backend == Backend::kCpu && argument != "out") EXPECT_THROW(reference_decode(a), Error);
}

TEST(Validation, BlockIdOutOfRangeInsideTheContext) {
  expect_rejected(
      [](DecodeArgs& a, testing::HostCase& c) {
        c.block_table[2 * c.table_stride + 1] = a.num_blocks;  // seq 2 uses blocks 0 and 1
      },
      ErrorCode::kOutOfRange, "block_table[2][1]", {"block_table[2][1] =", "[0, ", "num_blocks"});
  expect_rejected([](DecodeArgs&, testing::HostCase& c) { c.block_table[0] = -1; },
                  ErrorCode::kOutOfRange, "block_table[0][0]", {"= -1", "context_lens[0] = 20"});
}

TEST(Validation, ContextLengthNegativeOrBeyondTheTable) {
  expect_rejected([](DecodeArgs&, testing::HostCase& c) { c.context_lens[1] = -3; },
                  ErrorCode::kOutOfRange, "context_lens[1]", {"context_lens[1] = -3"});
  expect_rejected(
      [](DecodeArgs& a, testing::HostCase& c) {
        c.context_lens[0] = a.max_blocks_per_seq * a.block_size + 1;
      },
      ErrorCode::kOutOfRange, "context_lens[0]", {"max_blocks_per_seq * block_size"});
}

TEST(Validation, HeadRatioMustDivide) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.num_kv_heads = 3; },
                  ErrorCode::kInvalidArgument, "num_heads",
                  {"num_heads = 4 (num_kv_heads = 3)", "multiple"});
}

TEST(Validation, GroupSizeAboveTheLimit) {
  expect_rejected(
      [](DecodeArgs& a, testing::HostCase&) {
        a.num_heads = 130;
        a.num_kv_heads = 1;
      },
      ErrorCode::kUnsupported, "group_size", {"group_size = 130", "at most 64"});
}

TEST(Validation, UnsupportedHeadDim) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.head_dim = 100; },
                  ErrorCode::kUnsupported, "head_dim", {"head_dim = 100", "64, 80"});
}

TEST(Validation, BlockSizeOutOfRange) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.block_size = 0; },
                  ErrorCode::kUnsupported, "block_size", {"block_size = 0", "1 to 256"});
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.block_size = 257; },
                  ErrorCode::kUnsupported, "block_size", {"block_size = 257"});
}

TEST(Validation, NullPointers) {
  const std::vector<std::pair<std::string, std::function<void(DecodeArgs&)>>> cases = {
      {"q", [](DecodeArgs& a) { a.q = nullptr; }},
      {"k_cache", [](DecodeArgs& a) { a.k_cache = nullptr; }},
      {"v_cache", [](DecodeArgs& a) { a.v_cache = nullptr; }},
      {"block_table", [](DecodeArgs& a) { a.block_table = nullptr; }},
      {"context_lens", [](DecodeArgs& a) { a.context_lens = nullptr; }},
      {"out", [](DecodeArgs& a) { a.out = nullptr; }},
  };
  for (const auto& [name, mutate] : cases) {
    SCOPED_TRACE(name);
    expect_rejected([&](DecodeArgs& a, testing::HostCase&) { mutate(a); },
                    ErrorCode::kInvalidArgument, name, {name + " = null"});
  }
}

TEST(Validation, NegativeOrZeroSizes) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.batch = -1; },
                  ErrorCode::kInvalidArgument, "batch", {"batch = -1"});
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.num_heads = 0; },
                  ErrorCode::kInvalidArgument, "num_heads", {"num_heads = 0"});
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.num_kv_heads = -2; },
                  ErrorCode::kInvalidArgument, "num_kv_heads", {"num_kv_heads = -2"});
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.num_blocks = -1; },
                  ErrorCode::kInvalidArgument, "num_blocks", {"num_blocks = -1"});
}

TEST(Validation, TableStrideBelowTheRow) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.block_table_stride = 1; },
                  ErrorCode::kInvalidArgument, "block_table_stride",
                  {"block_table_stride = 1", "max_blocks_per_seq"});
}

TEST(Validation, MismatchedCacheDtypes) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.v_dtype = DType::kF16; },
                  ErrorCode::kUnsupported, "v_dtype", {"v_dtype = f16", "k_dtype (f32)"});
}

TEST(Validation, NonFiniteScale) {
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.scale = INFINITY; },
                  ErrorCode::kInvalidArgument, "scale", {"scale = inf"});
}

TEST(Validation, UnavailableBackendIsAnErrorThatSaysWhy) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  expect_rejected([](DecodeArgs&, testing::HostCase&) {}, ErrorCode::kBackendUnavailable, "backend",
                  {"backend = cuda", "unavailable"}, Backend::kCuda);
}

TEST(Validation, UnknownBackendNames) {
  try {
    parse_backend("gpu");
    ADD_FAILURE() << "parse_backend accepted 'gpu'";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find("backend = 'gpu'"), std::string::npos) << e.what();
  }
}

// DecodeOptions: a Backend outside the enum and a thread count outside [0, kMaxThreads] are
// errors naming the field, with out and lse untouched.
void expect_options_rejected(const std::function<void(DecodeOptions&)>& mutate,
                             const std::string& argument, const std::vector<std::string>& parts) {
  testing::HostCase c = small_case();
  const Unwritten unwritten(c);
  DecodeOptions o;
  o.backend = Backend::kCpu;
  mutate(o);
  expect_error([&] { decode(c.args(), o); }, ErrorCode::kInvalidArgument, argument, parts,
               "decode with a bad " + argument);
  unwritten.check();
}

TEST(Validation, ThreadCountOutOfRange) {
  expect_options_rejected([](DecodeOptions& o) { o.num_threads = -1; }, "num_threads",
                          {"num_threads = -1", "[0, 4096]"});
  expect_options_rejected([](DecodeOptions& o) { o.num_threads = kMaxThreads + 1; }, "num_threads",
                          {"num_threads = 4097"});
  expect_options_rejected([](DecodeOptions& o) { o.num_threads = INT32_MIN; }, "num_threads",
                          {"num_threads = -2147483648"});
}

TEST(Validation, ThreadCountsInRangeAreAccepted) {
  for (const int n : {0, 1, 3}) {
    testing::HostCase c = small_case();
    DecodeOptions o;
    o.backend = Backend::kCpu;
    o.num_threads = n;
    EXPECT_NO_THROW(decode(c.args(), o)) << "num_threads = " << n;
  }
}

TEST(Validation, BackendOutsideTheEnum) {
  for (const int v : {3, -1, 99}) {
    expect_options_rejected([v](DecodeOptions& o) { o.backend = static_cast<Backend>(v); },
                            "backend", {"backend = " + std::to_string(v), "not a Backend"});
  }
}

TEST(Validation, DtypesOutsideTheEnum) {
  const std::vector<std::pair<std::string, std::function<void(DecodeArgs&)>>> cases = {
      {"q_dtype", [](DecodeArgs& a) { a.q_dtype = static_cast<DType>(7); }},
      {"k_dtype", [](DecodeArgs& a) { a.k_dtype = static_cast<DType>(-1); }},
      {"v_dtype", [](DecodeArgs& a) { a.v_dtype = static_cast<DType>(16); }},
      {"out_dtype", [](DecodeArgs& a) { a.out_dtype = static_cast<DType>(42); }},
  };
  for (const auto& [name, mutate] : cases) {
    SCOPED_TRACE(name);
    expect_rejected([&](DecodeArgs& a, testing::HostCase&) { mutate(a); },
                    ErrorCode::kInvalidArgument, name, {name + " = ", "not a DType"});
  }
}

TEST(Validation, Fp8IsACacheDtypeOnly) {
  for (const char* name : {"q_dtype", "out_dtype"}) {
    for (const DType t : {DType::kFP8E4M3, DType::kFP8E5M2}) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(t));
      expect_rejected([&](DecodeArgs& a,
                          testing::HostCase&) { (name[0] == 'q' ? a.q_dtype : a.out_dtype) = t; },
                      ErrorCode::kUnsupported, name, {dtype_name(t), "K and V caches only"});
    }
  }
}

TEST(Validation, KvScales) {
  // Scales on a cache other than fp8 (the default case is f32).
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.k_scale = 0.5f; },
                  ErrorCode::kUnsupported, "k_scale", {"quantized caches only"});
  static const float kOnes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  expect_rejected([](DecodeArgs& a, testing::HostCase&) { a.v_scales = kOnes; },
                  ErrorCode::kUnsupported, "v_scales", {"quantized caches only"});
  // Out of range, on an fp8 cache.
  for (const float bad : {0.f, -1.f, NAN, INFINITY, 1e31f, 1e-31f}) {
    SCOPED_TRACE(bad);
    expect_rejected(
        [bad](DecodeArgs& a, testing::HostCase&) {
          a.k_dtype = a.v_dtype = DType::kFP8E4M3;
          a.v_scale = bad;
        },
        ErrorCode::kInvalidArgument, "v_scale", {"v_scale = ", "must be in ["});
  }
}

TEST(Validation, PerHeadKvScalesAreChecked) {
  testing::CaseSpec s;
  s.batch = 2;
  s.num_kv_heads = 3;
  s.num_heads = 6;
  s.context_lens = {5, 40};
  s.kv_dtype = DType::kFP8E5M2;
  s.per_head_scales = true;
  testing::HostCase c = testing::make_case(s);
  c.k_scales[1] = NAN;
  c.poison_outputs();
  const std::vector<std::uint8_t> before = c.out;
  try {
    decode(c.args(), DecodeOptions{Backend::kCpu});
    ADD_FAILURE() << "a NaN k_scales[1] was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "k_scales[1]") << e.what();
  }
  EXPECT_EQ(c.out, before);
  EXPECT_THROW(reference_decode(c.args()), Error);
  // context_parallel_decode checks them as decode does (and decodes a valid fp8 case).
  auto group = make_local_group(1);
  try {
    context_parallel_decode(c.args(), *group[0], DecodeOptions{Backend::kCpu});
    ADD_FAILURE() << "context_parallel_decode accepted a NaN k_scales[1]";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "k_scales[1]") << e.what();
  }
  EXPECT_EQ(c.out, before);
  c.k_scales[1] = 1.5f;
  context_parallel_decode(c.args(), *group[0], DecodeOptions{Backend::kCpu});
  testing::expect_matches_reference(c);
}

}  // namespace
}  // namespace pagedattn
