// merge_states (pagedattn/merge_states.hpp) on each backend: the states of a context cut into
// segments (uneven cuts, empty segments, any order) merge into the decode of the whole context,
// checked against the f64 reference; empty rows, NaN and single segments; every bad argument an
// Error naming it with the output untouched. CUDA rows skip where no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest_printers.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/error.hpp"
#include "pagedattn/merge_states.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::DeviceBuffer;

bool backend_ready(Backend b) {
  return b == Backend::kCpu || (cuda_available() && testing::device_memory_built());
}

// Runs merge_states on `backend` over host buffers (device copies for CUDA).
void run_merge(Backend backend, MergeStatesArgs a, std::vector<std::uint8_t>& out,
               std::vector<float>* lse) {
  MergeStatesOptions o;
  o.backend = backend;
  if (backend == Backend::kCpu) {
    a.out = out.data();
    a.lse = lse ? lse->data() : nullptr;
    merge_states(a, o);
    return;
  }
  const std::size_t part_bytes =
      static_cast<std::size_t>(a.num_segments) * a.num_rows * a.head_dim * dtype_size(a.part_dtype);
  DeviceBuffer parts(a.parts, part_bytes);
  DeviceBuffer part_lse(a.part_lse, sizeof(float) * a.num_segments * a.num_rows);
  DeviceBuffer d_out(out.data(), out.size());
  DeviceBuffer d_lse(lse ? lse->data() : nullptr, lse ? sizeof(float) * lse->size() : 0);
  a.parts = parts.get();
  a.part_lse = part_lse.as<float>();
  a.out = d_out.get();
  a.lse = lse ? d_lse.as<float>() : nullptr;
  merge_states(a, o);
  d_out.to_host(out);
  if (lse) d_lse.to_host(*lse);
}

// The looser of two dtypes' tolerances.
DType looser(DType a, DType b) {
  if (a == DType::kBF16 || b == DType::kBF16) return DType::kBF16;
  if (a == DType::kF16 || b == DType::kF16) return DType::kF16;
  return DType::kF32;
}

using MergeParam = std::tuple<Backend, DType, DType>;  // backend, part dtype, out dtype

class MergeSegments : public ::testing::TestWithParam<MergeParam> {};

TEST_P(MergeSegments, MatchTheWholeContext) {
  const auto [backend, part_dtype, out_dtype] = GetParam();
  if (!backend_ready(backend)) GTEST_SKIP() << "no CUDA device";
  for (int round = 0; round < 3; ++round) {
    testing::CaseSpec spec;
    spec.batch = 4;
    spec.num_heads = 8;
    spec.num_kv_heads = 2;
    spec.head_dim = 64;
    spec.block_size = 16;
    spec.context_lens = {1000, 37, 0, 16 * (round + 1)};
    spec.q_dtype = spec.kv_dtype = DType::kBF16;
    spec.out_dtype = looser(part_dtype, out_dtype);
    spec.seed = testing::seed_for(testing::stable_hash(
                    ::testing::UnitTest::GetInstance()->current_test_info()->name())) +
                round;
    SCOPED_TRACE(testing::describe(spec) + " round " + std::to_string(round) +
                 " (replay with PAGEDATTN_TEST_SEED=" + std::to_string(testing::base_seed()) + ")");
    testing::HostCase whole = testing::make_case(spec);
    const int B = spec.batch, H = spec.num_heads, D = spec.head_dim, BS = spec.block_size;
    const int R = B * H;
    // Cut every sequence's blocks at two random places: three segments, some of them empty.
    constexpr int S = 3;
    std::mt19937 rng(static_cast<std::uint32_t>(spec.seed));
    std::vector<std::array<int, S + 1>> cuts(B);
    for (int b = 0; b < B; ++b) {
      const int nb = (whole.context_lens[b] + BS - 1) / BS;
      int c1 = std::uniform_int_distribution<int>(0, nb)(rng);
      int c2 = std::uniform_int_distribution<int>(0, nb)(rng);
      if (c1 > c2) std::swap(c1, c2);
      cuts[b] = {0, c1, c2, nb};
    }
    std::vector<std::uint8_t> parts(static_cast<std::size_t>(S) * R * D * dtype_size(part_dtype));
    std::vector<float> part_lse(static_cast<std::size_t>(S) * R);
    for (int s = 0; s < S; ++s) {
      testing::HostCase seg = whole;
      seg.spec.out_dtype = part_dtype;
      seg.out.assign(static_cast<std::size_t>(R) * D * dtype_size(part_dtype), 0);
      std::fill(seg.block_table.begin(), seg.block_table.end(), -1);
      for (int b = 0; b < B; ++b) {
        const int lo = cuts[b][s], hi = cuts[b][s + 1];
        for (int i = lo; i < hi; ++i) {
          seg.block_table[static_cast<std::size_t>(b) * seg.table_stride + i - lo] =
              whole.block_table[static_cast<std::size_t>(b) * whole.table_stride + i];
        }
        seg.context_lens[b] = std::max(0, std::min(whole.context_lens[b], hi * BS) - lo * BS);
      }
      seg.poison_outputs();
      testing::run_decode(seg, detail::DecodeOptions{});
      std::copy(seg.out.begin(), seg.out.end(), parts.begin() + s * seg.out.size());
      std::copy(seg.lse.begin(), seg.lse.end(), part_lse.begin() + static_cast<std::size_t>(s) * R);
    }
    MergeStatesArgs a;
    a.num_segments = S;
    a.num_rows = R;
    a.head_dim = D;
    a.parts = parts.data();
    a.part_dtype = part_dtype;
    a.part_lse = part_lse.data();
    a.out_dtype = out_dtype;
    testing::HostCase merged = whole;
    merged.spec.out_dtype = out_dtype;
    merged.out.assign(static_cast<std::size_t>(R) * D * dtype_size(out_dtype), 0xff);
    std::fill(merged.lse.begin(), merged.lse.end(), std::nanf(""));
    run_merge(backend, a, merged.out, &merged.lse);
    // compare_with_reference holds the result to out_dtype's tolerance; parts rounded to a
    // looser dtype are held to that one instead.
    merged.spec.out_dtype = looser(part_dtype, out_dtype);
    if (merged.spec.out_dtype != out_dtype) {
      std::vector<std::uint8_t> widened(static_cast<std::size_t>(R) * D *
                                        dtype_size(merged.spec.out_dtype));
      for (std::size_t i = 0; i < static_cast<std::size_t>(R) * D; ++i) {
        store_from_float(widened.data(), merged.spec.out_dtype, i,
                         load_as_float(merged.out.data(), out_dtype, i));
      }
      merged.out = widened;
    }
    const testing::Comparison cmp = testing::compare_with_reference(merged);
    EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(merged.spec.out_dtype)) << cmp.first_bad;
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << cmp.first_bad;
    // The empty sequence (context 0) stays empty: out 0, lse -inf.
    for (int h = 0; h < H; ++h) {
      EXPECT_EQ(merged.lse[2 * H + h], -std::numeric_limits<float>::infinity());
      EXPECT_EQ(load_as_float(merged.out.data(), merged.spec.out_dtype, (2 * H + h) * D), 0.f);
    }
  }
}

std::string merge_name(const ::testing::TestParamInfo<MergeParam>& info) {
  const auto [backend, part, out] = info.param;
  return std::string(backend == Backend::kCpu ? "cpu" : "cuda") + "_parts_" + dtype_name(part) +
         "_out_" + dtype_name(out);
}

INSTANTIATE_TEST_SUITE_P(All, MergeSegments,
                         ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(DType::kF32, DType::kF16,
                                                              DType::kBF16)),
                         merge_name);

class MergeEdges : public ::testing::TestWithParam<Backend> {};

// Rows built by hand: every segment empty; a NaN lse; one non-empty segment among empty ones;
// two segments of equal lse; and no segments at all.
TEST_P(MergeEdges, EmptyNaNSingleAndEqual) {
  const Backend backend = GetParam();
  if (!backend_ready(backend)) GTEST_SKIP() << "no CUDA device";
  constexpr int S = 3, R = 4, D = 8;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> parts(S * R * D), lse_in(S * R, -inf);
  for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = 0.25f * static_cast<float>(i % 13) - 1;
  auto at = [&](int s, int r, int d) -> float& { return parts[(s * R + r) * D + d]; };
  lse_in[1 * R + 1] = std::nanf("");  // row 1: NaN in segment 1
  lse_in[0 * R + 1] = 2.f;
  lse_in[2 * R + 2] = 1.5f;                      // row 2: only segment 2
  lse_in[0 * R + 3] = lse_in[2 * R + 3] = 0.5f;  // row 3: two equal segments
  MergeStatesArgs a;
  a.num_segments = S;
  a.num_rows = R;
  a.head_dim = D;
  a.parts = parts.data();
  a.part_lse = lse_in.data();
  std::vector<std::uint8_t> out(R * D * sizeof(float), 0x7f);
  std::vector<float> lse(R, 7.f);
  run_merge(backend, a, out, &lse);
  const auto* o = reinterpret_cast<const float*>(out.data());
  for (int d = 0; d < D; ++d) {
    EXPECT_EQ(o[0 * D + d], 0.f) << d;
    EXPECT_TRUE(std::isnan(o[1 * D + d])) << d;
    EXPECT_FLOAT_EQ(o[2 * D + d], at(2, 2, d)) << d;
    EXPECT_NEAR(o[3 * D + d], 0.5f * (at(0, 3, d) + at(2, 3, d)), 1e-6f) << d;
  }
  EXPECT_EQ(lse[0], -inf);
  EXPECT_TRUE(std::isnan(lse[1]));
  EXPECT_FLOAT_EQ(lse[2], 1.5f);
  EXPECT_NEAR(lse[3], 0.5f + std::log(2.f), 1e-6f);

  // No segments: every row is empty; the inputs are not read (null is allowed).
  a.num_segments = 0;
  a.parts = nullptr;
  a.part_lse = nullptr;
  std::fill(out.begin(), out.end(), 0x7f);
  run_merge(backend, a, out, &lse);
  for (int i = 0; i < R * D; ++i) EXPECT_EQ(o[i], 0.f) << i;
  for (int r = 0; r < R; ++r) EXPECT_EQ(lse[r], -inf) << r;
}

INSTANTIATE_TEST_SUITE_P(All, MergeEdges, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(info.param == Backend::kCpu ? "cpu" : "cuda");
                         });

// Each bad argument is an Error naming it, and nothing is written.
TEST(MergeStatesValidation, EveryBadArgumentNamed) {
  std::vector<float> parts(2 * 3 * 4, 1.f), lse_in(2 * 3, 0.f), out(3 * 4, 9.f), lse(3, 9.f);
  auto good = [&] {
    MergeStatesArgs a;
    a.num_segments = 2;
    a.num_rows = 3;
    a.head_dim = 4;
    a.parts = parts.data();
    a.part_lse = lse_in.data();
    a.out = out.data();
    a.lse = lse.data();
    return a;
  };
  MergeStatesOptions cpu;
  cpu.backend = Backend::kCpu;
  struct Bad {
    const char* argument;
    MergeStatesArgs args;
    MergeStatesOptions options;
  };
  std::vector<Bad> cases;
  auto add = [&](const char* argument, auto change_args, auto change_options) {
    Bad b{argument, good(), cpu};
    change_args(b.args);
    change_options(b.options);
    cases.push_back(b);
  };
  auto same = [](auto&) {};
  add(
      "num_segments", [](MergeStatesArgs& a) { a.num_segments = -1; }, same);
  add(
      "num_rows", [](MergeStatesArgs& a) { a.num_rows = -2; }, same);
  add(
      "head_dim", [](MergeStatesArgs& a) { a.head_dim = 0; }, same);
  add(
      "part_dtype", [](MergeStatesArgs& a) { a.part_dtype = static_cast<DType>(9); }, same);
  add(
      "out_dtype", [](MergeStatesArgs& a) { a.out_dtype = static_cast<DType>(-1); }, same);
  add(
      "parts", [](MergeStatesArgs& a) { a.parts = nullptr; }, same);
  add(
      "part_lse", [](MergeStatesArgs& a) { a.part_lse = nullptr; }, same);
  add(
      "out", [](MergeStatesArgs& a) { a.out = nullptr; }, same);
  add(
      "num_rows", [](MergeStatesArgs& a) { a.num_rows = 1 << 30, a.num_segments = 1 << 30; }, same);
  add("backend", same, [](MergeStatesOptions& o) { o.backend = static_cast<Backend>(5); });
  add("num_threads", same, [](MergeStatesOptions& o) { o.num_threads = -1; });
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.argument);
    try {
      merge_states(b.args, b.options);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), b.argument) << e.what();
    }
    for (float x : out) ASSERT_EQ(x, 9.f);
    for (float x : lse) ASSERT_EQ(x, 9.f);
  }
  // No rows: a no-op whatever the pointers.
  MergeStatesArgs empty = good();
  empty.num_rows = 0;
  empty.parts = nullptr;
  empty.part_lse = nullptr;
  empty.out = nullptr;
  EXPECT_NO_THROW(merge_states(empty, cpu));
}

}  // namespace
}  // namespace pagedattn
