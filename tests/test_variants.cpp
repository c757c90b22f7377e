// The attention variants of DecodeArgs (window_left, logits_soft_cap, alibi_slopes, sinks; see
// pagedattn/variants.hpp) on every backend against the f64 reference: each alone and all
// together, over dtypes, head dims, GQA groups, block sizes, windows and lengths. A window is
// checked on a copy of the case where everything before it is unreadable (table entries of -1 and
// garbage, NaN in the cache), against the reference of the clean case. Also: every CPU
// instruction set's kernel, NaN and Inf inside the window, sinks on empty contexts and as a
// denominator term only, a block-aligned window as the truncated context, the argument errors,
// context-parallel decode, and bitwise determinism. The CUDA rows skip where no device is
// present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "bad_input.hpp"
#include "cpu_kernel.hpp"
#include "gtest_printers.hpp"
#include "kernel_context.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cp_shares.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/poison.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "pagedattn/variants.hpp"
#include "poisoned_heads.hpp"
#include "rank_threads.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Makes everything before each sequence's window unreadable, so that reading any of it shows as a
// NaN or an out-of-bounds access: the table entries of the blocks wholly before the window become
// -1, ids past the pool, negative garbage, the id of a block no sequence owns (make_case fills
// those with NaN), or keep their id while that block is filled with NaN; the slots before the
// window's first token in its first block get NaN. A no-op without a window.
void poison_before_window(testing::HostCase& c, int window_left) {
  if (window_left < 0) return;
  const int BS = c.spec.block_size;
  const int spare = testing::unowned_block(c);
  ASSERT_LT(spare, c.num_blocks) << "the case needs a spare block";
  for (int b = 0; b < c.spec.batch; ++b) {
    const int L = c.context_lens[b];
    if (L == 0) continue;
    const int t0 = window_first_token(L, window_left);
    const int first = t0 / BS;
    testing::poison_table_entries(c, b, first, spare);
    testing::store_nan_tokens(c, b, first * BS, t0);
  }
}

// Runs decode with the variants over the case on `backend`: on the CPU over the host buffers, on
// CUDA over device copies (DeviceCase copies the slopes and sinks too), out and lse copied back.
void run_variant_decode(testing::HostCase& c, const Variants& v, Backend backend,
                        detail::DecodeOptions o = {}) {
  o.backend = backend;
  const DecodeArgs host = with_variants(c.args(), v);
  if (backend != Backend::kCuda) {
    detail::decode(host, o);
    return;
  }
  testing::cuda_decode_from_host(host, o);
}

// testing::expect_matches_reference (reference_check.hpp) for compare_outputs.
void expect_matches(const testing::HostCase& c, const ReferenceResult& ref,
                    const std::string& what) {
  const testing::Comparison cmp = testing::compare_outputs(c, ref);
  SCOPED_TRACE(what + ": " + testing::describe(c.spec) + " " + testing::seed_note(c.spec.seed));
  EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype));
  EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance());
}

// The reference reads the case only (args() hands out writable pointers for the outputs).
ReferenceResult variant_reference(const testing::HostCase& c, const Variants& v) {
  return reference_decode(with_variants(const_cast<testing::HostCase&>(c).args(), v));
}

// max |a - b| over out, relative to max |b|.
double rel_diff(const ReferenceResult& a, const ReferenceResult& b) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.out.size(); ++i) {
    err = std::max(err, std::fabs(a.out[i] - b.out[i]));
    scale = std::max(scale, std::fabs(b.out[i]));
  }
  return err / scale;
}

// Poisons a copy of `clean` before the window, decodes it with the variants and checks it against
// the reference of the clean case.
void check_variant(const testing::HostCase& clean, const Variants& v, Backend backend,
                   const std::string& what = "") {
  testing::HostCase c = clean;
  const ReferenceResult ref = variant_reference(c, v);
  poison_before_window(c, v.window_left);
  run_variant_decode(c, v, backend);
  expect_matches(c, ref, what + (what.empty() ? "" : " ") + describe(v));
}

// ---- The grid: every variant alone and all of them together, against the reference. ----

using GridParam = std::tuple<Backend, VariantKind, DType, GridShape>;
class VariantReference : public ::testing::TestWithParam<GridParam> {};

// The windows of a grid row: the last token alone (0), two tokens, around one block, one that
// starts inside a block of the long sequence and spans several of its splits, exactly the longest
// context, and more than any context.
std::vector<int> windows_for(int block_size, int longest) {
  std::set<int> w = {block_size - 1, block_size, block_size + 1};
  w.insert({0, 1, 1000, longest - 1, longest + 100});
  return {w.begin(), w.end()};
}

TEST_P(VariantReference, MatchesTheReference) {
  const auto [backend, kind, dtype, shape] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int BS = shape.block_size;
  // The long sequence is split into several work items (as in test_non_finite.cpp); the others
  // are empty, one token, and end just before, at and after block boundaries.
  const int longest = 3001;
  testing::CaseSpec spec = variant_spec(dtype, shape.head_dim, BS, shape.group,
                                        {longest, 0, 1, BS - 1, BS, BS + 1, 2 * BS, 37});
  // Logits of order 9 (magnitude 3): large enough for a cap of 5 or 30 to bend them.
  if (kind == VariantKind::kSoftCap || kind == VariantKind::kAll) spec.magnitude = 3.f;
  const testing::HostCase c = testing::make_case(spec);
  const int H = spec.num_heads;

  Variants base;
  if (kind == VariantKind::kAlibi || kind == VariantKind::kAll) base.slopes = alibi_slopes(H);
  if (kind == VariantKind::kSinks || kind == VariantKind::kAll) base.sinks = sink_logits(H);
  if (kind == VariantKind::kAll) base.soft_cap = 30.f;

  if (kind == VariantKind::kWindow || kind == VariantKind::kAll) {
    for (int w : windows_for(BS, longest)) {
      Variants v = base;
      v.window_left = w;
      check_variant(c, v, backend);
    }
  } else if (kind == VariantKind::kSoftCap) {
    for (float cap : {5.f, 30.f, 50.f}) {
      Variants v = base;
      v.soft_cap = cap;
      // The cap must move the result far beyond the tolerance, or the check proves nothing.
      EXPECT_GT(rel_diff(variant_reference(c, v), variant_reference(c, base)), 0.05)
          << "cap " << cap;
      check_variant(c, v, backend);
    }
  } else {
    check_variant(c, base, backend);
  }
}

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [backend, kind, dtype, shape] = info.param;
  return std::string(backend_name(backend)) + "_" + kind_name(kind) + "_" + dtype_name(dtype) +
         "_d" + std::to_string(shape.head_dim) + "_bs" + std::to_string(shape.block_size) + "_g" +
         std::to_string(shape.group);
}

// Head dims 64, 128 and 80 (a padded one), groups 1, 4, 8 and 16, block sizes 1, 16 and 7.
INSTANTIATE_TEST_SUITE_P(
    Grid, VariantReference,
    ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                       ::testing::Values(VariantKind::kWindow, VariantKind::kSoftCap,
                                         VariantKind::kAlibi, VariantKind::kSinks,
                                         VariantKind::kAll),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(GridShape{64, 16, 4}, GridShape{128, 16, 8},
                                         GridShape{80, 7, 1}, GridShape{128, 1, 16})),
    grid_name);

// ---- Every instruction set's CPU kernel (the backend itself runs only the one it picks). ----

// Runs one instruction set's kernel over each sequence's window as a single item covering every
// kv head (the backend's path, with the q buffer), finalizes as the backend does (the sink joins
// the sum) and writes out (f32) and lse into the case.
void run_kernel(testing::HostCase& c, const Variants& v, detail::cpu::KernelFn fn) {
  const DecodeArgs a = with_variants(c.args(), v);
  const int H = a.num_heads, D = a.head_dim, G = a.group_size(), KV = a.num_kv_heads;
  std::vector<float> q;
  detail::cpu::ItemContext ctx = item_context(a, q);
  alignas(64) float scores[detail::cpu::kHeadTile * 256];
  std::vector<float> m(H), l(H), acc(static_cast<std::size_t>(H) * D);
  std::vector<float> q_buffer(static_cast<std::size_t>(H) * D + 16);
  float* out = reinterpret_cast<float*>(c.out.data());
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    const WorkItem item{b, 0, 0, window_first_block(L, a.window_left, a.block_size),
                        blocks_for(L, a.block_size)};
    fn(ctx, item, KV, m.data(), l.data(), acc.data(),
       detail::cpu::ItemScratch{scores, q_buffer.data()});
    for (int h = 0; h < H; ++h) {
      SoftmaxState st{m[h], l[h]};
      const float fa = a.sinks ? add_sink(st, a.sinks[h]) : 1.f;
      const bool nan = std::isnan(st.l);
      const float inv = nan ? kNaN : st.inv_sum() * fa;
      const std::size_t row = static_cast<std::size_t>(b) * H + h;
      for (int d = 0; d < D; ++d) out[row * D + d] = acc[static_cast<std::size_t>(h) * D + d] * inv;
      c.lse[row] = nan ? kNaN : st.lse();
    }
  }
}

TEST(VariantCpuIsa, EveryKernelAppliesTheVariants) {
  std::vector<std::pair<const char*, detail::cpu::KernelFn>> kernels;
  for (const char* name : {"amx", "avx512bf16", "avx512", "avx2", "sse2", "neon"}) {
    if (const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa(name)) {
      kernels.emplace_back(name, fn);
    }
  }
  ASSERT_FALSE(kernels.empty());
  std::uint64_t salt = 0;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    // Groups 1, 3 (a partial head tile), 4, 8 and 16 (two tiles); blocks 16, 7, 1 and 33.
    for (const GridShape& s : {GridShape{64, 16, 4}, GridShape{80, 7, 3}, GridShape{128, 1, 8},
                               GridShape{128, 33, 16}, GridShape{64, 16, 1}}) {
      const int BS = s.block_size;
      testing::CaseSpec spec =
          variant_spec(dt, s.head_dim, BS, s.group, {700, 0, 1, BS, BS + 1, 37}, ++salt);
      spec.out_dtype = DType::kF32;  // the kernel's own f32 results
      spec.magnitude = 2.f;
      const testing::HostCase clean = testing::make_case(spec);
      const int H = spec.num_heads;
      std::vector<Variants> configs(7);
      configs[0].window_left = 0;
      configs[1].window_left = BS + 1;
      configs[2].window_left = 300;
      configs[3].soft_cap = 5.f;
      configs[4].slopes = alibi_slopes(H);
      configs[5].sinks = sink_logits(H);
      configs[6] = {300, 30.f, alibi_slopes(H), sink_logits(H)};
      for (const Variants& v : configs) {
        testing::HostCase c = clean;
        const ReferenceResult ref = variant_reference(c, v);
        poison_before_window(c, v.window_left);
        for (const auto& [name, fn] : kernels) {
          c.poison_outputs();
          run_kernel(c, v, fn);
          expect_matches(c, ref, std::string(name) + " " + describe(v));
        }
      }
    }
  }
}

// ---- Sinks and windows checked beyond the reference comparison, and determinism. ----

class VariantBackend : public ::testing::TestWithParam<Backend> {};

// L = 0: out = 0 and lse = the sink (-inf where the head has none), whatever q holds.
TEST_P(VariantBackend, EmptyContextGivesZeroOutAndTheSinkAsLse) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::kF32, DType::kBF16}) {
    testing::CaseSpec spec = variant_spec(dt, 128, 16, 5, {0, 40, 0});
    testing::HostCase c = testing::make_case(spec);
    const int H = spec.num_heads, D = spec.head_dim;
    store_from_float(c.q.data(), dt, (2 * H + 3) * static_cast<std::size_t>(D) + 5, kNaN);
    for (const Variants& v : {Variants{-1, 0.f, {}, sink_logits(H)},
                              Variants{0, 30.f, alibi_slopes(H), sink_logits(H)}}) {
      SCOPED_TRACE(describe(v) + " " + dtype_name(dt));
      const ReferenceResult ref = variant_reference(c, v);
      c.poison_outputs();
      run_variant_decode(c, v, backend);
      for (int b : {0, 2}) {
        for (int h = 0; h < H; ++h) {
          const std::size_t row = static_cast<std::size_t>(b) * H + h;
          for (int d = 0; d < D; ++d) {
            ASSERT_EQ(load_as_float(c.out.data(), dt, row * D + d), 0.f) << "seq " << b;
          }
          if (v.sinks[h] == -kInf) {
            EXPECT_EQ(c.lse[row], -kInf) << "seq " << b << " head " << h;
          } else {
            EXPECT_NEAR(c.lse[row], v.sinks[h], testing::lse_tolerance())
                << "seq " << b << " head " << h;
          }
        }
      }
      expect_matches(c, ref, describe(v));
    }
  }
}

// A sink of -inf is no sink: the same bits as a call without sinks.
TEST_P(VariantBackend, NegativeInfiniteSinksAreNoSinks) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const testing::HostCase clean =
        testing::make_case(variant_spec(dt, 128, 16, 4, {2500, 0, 1, 17}));
    const int H = clean.spec.num_heads;
    for (const Variants& v : {Variants{}, Variants{200, 30.f, alibi_slopes(H), {}}}) {
      SCOPED_TRACE(describe(v) + " " + dtype_name(dt));
      testing::HostCase without = clean, with = clean;
      run_variant_decode(without, v, backend);
      Variants s = v;
      s.sinks.assign(H, -kInf);
      run_variant_decode(with, s, backend);
      EXPECT_TRUE(with.out == without.out) << "out differs";
      EXPECT_EQ(std::memcmp(with.lse.data(), without.lse.data(), with.lse.size() * 4), 0)
          << "lse differs";
      expect_matches(with, variant_reference(with, s), "-inf sinks");
    }
  }
}

// A sink only adds exp(sink) to the softmax's denominator: out is the sink-free out scaled by
// exp(lse - lse'), and lse' = log(exp(lse) + exp(sink)).
TEST_P(VariantBackend, SinksOnlyAddToTheDenominator) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const testing::HostCase clean =
      testing::make_case(variant_spec(DType::kF32, 64, 16, 8, {3000, 1, 16, 100}));
  const int H = clean.spec.num_heads, D = clean.spec.head_dim;
  for (const Variants& v : {Variants{}, Variants{500, 30.f, alibi_slopes(H), {}}}) {
    SCOPED_TRACE(describe(v));
    testing::HostCase without = clean, with = clean;
    run_variant_decode(without, v, backend);
    Variants s = v;
    s.sinks = sink_logits(H);
    run_variant_decode(with, s, backend);
    expect_matches(with, variant_reference(with, s), "with sinks");
    const float* x = reinterpret_cast<const float*>(without.out.data());
    const float* y = reinterpret_cast<const float*>(with.out.data());
    double scale = 1e-30, err = 0, lse_err = 0;
    for (std::size_t row = 0; row < without.lse.size(); ++row) {
      const double lse0 = without.lse[row], sink = s.sinks[row % H];
      const double lse1 =
          sink == -kInf ? lse0
                        : std::max(lse0, sink) + std::log1p(std::exp(-std::fabs(lse0 - sink)));
      lse_err = std::max(lse_err, std::fabs(with.lse[row] - lse1));
      const double f = std::exp(lse0 - lse1);
      for (int d = 0; d < D; ++d) {
        scale = std::max(scale, std::fabs(double(y[row * D + d])));
        err = std::max(err, std::fabs(y[row * D + d] - f * x[row * D + d]));
      }
    }
    EXPECT_LE(err / scale, 2 * testing::out_tolerance(DType::kF32));
    EXPECT_LE(lse_err, 2 * testing::lse_tolerance());
  }
}

// A window whose first token starts a block is the context truncated to it: the same decode as
// that of a table shifted to the window's first block, with the lengths cut to the window (ALiBi
// positions count back from the last token, so they do not move). This checks the windowed
// results against the reference of an unwindowed case.
TEST_P(VariantBackend, BlockAlignedWindowIsTheTruncatedContext) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int BS = 16, w = 40 * BS - 1;  // first token L - 40 * BS: block-aligned for L % BS == 0
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const testing::HostCase clean =
        testing::make_case(variant_spec(dt, 128, BS, 4, {3200, 1600, 960, 16, 1, 0}));
    const int H = clean.spec.num_heads;
    testing::HostCase cut = clean;
    for (int b = 0; b < clean.spec.batch; ++b) {
      const int L = clean.context_lens[b];
      const int first = window_first_token(L, w) / BS;
      ASSERT_EQ(window_first_token(L, w), first * BS);
      for (int i = 0; i < clean.table_stride; ++i) {
        table_entry(cut, b, i) = i + first < clean.table_stride
                                     ? clean.block_table[b * clean.table_stride + i + first]
                                     : -1;
      }
      cut.context_lens[b] = L - first * BS;
    }
    for (const Variants& v :
         {Variants{w, 0.f, {}, {}}, Variants{w, 30.f, alibi_slopes(H), sink_logits(H)}}) {
      SCOPED_TRACE(describe(v) + " " + dtype_name(dt));
      Variants unwindowed = v;
      unwindowed.window_left = -1;
      const ReferenceResult ref = variant_reference(cut, unwindowed);
      testing::HostCase c = clean;
      poison_before_window(c, w);
      run_variant_decode(c, v, backend);
      expect_matches(c, ref, "against the truncated context");
    }
  }
}

// Same inputs, same options: the same bits, call after call. On the CPU also one thread against
// two and the single-split plan, which split differently and so agree to rounding only (as in
// Api.ThreadCountsAndSingleSplitGiveTheSameResult). The case moves enough K/V in its windows (over
// 16 MB: twice work_threads.hpp's bytes per thread) for the CPU backend to take both threads.
TEST_P(VariantBackend, RepeatedCallsGiveTheSameBits) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec = variant_spec(DType::kF32, 64, 16, 2, {12000, 1, 2000, 333, 0});
  spec.num_kv_heads = 4;
  spec.num_heads = 8;
  spec.magnitude = 2.f;
  const testing::HostCase clean = testing::make_case(spec);
  const Variants v{9000, 30.f, alibi_slopes(8), sink_logits(8)};
  const ReferenceResult ref = variant_reference(clean, v);
  testing::HostCase poisoned = clean;
  poison_before_window(poisoned, v.window_left);
  auto run = [&](int threads, bool single_split) {
    testing::HostCase c = poisoned;
    detail::DecodeOptions o;
    o.num_threads = threads;
    o.single_split = single_split;
    run_variant_decode(c, v, backend, o);
    expect_matches(c, ref,
                   "threads " + std::to_string(threads) + (single_split ? " single split" : ""));
    return c;
  };
  const std::vector<int> thread_counts =
      backend == Backend::kCpu ? std::vector<int>{2, 1} : std::vector<int>{0};
  std::vector<testing::HostCase> firsts;
  for (int threads : thread_counts) {
    const testing::HostCase first = run(threads, false);
    for (int rep = 0; rep < 2; ++rep) {
      const testing::HostCase again = run(threads, false);
      EXPECT_TRUE(again.out == first.out) << "threads " << threads << " run " << rep;
      EXPECT_EQ(std::memcmp(again.lse.data(), first.lse.data(), first.lse.size() * 4), 0)
          << "threads " << threads << " run " << rep;
    }
    firsts.push_back(first);
  }
  if (backend != Backend::kCpu) return;
  firsts.push_back(run(1, true));
  const float* x = reinterpret_cast<const float*>(firsts[0].out.data());
  for (std::size_t k = 1; k < firsts.size(); ++k) {
    const float* y = reinterpret_cast<const float*>(firsts[k].out.data());
    for (std::size_t i = 0; i < firsts[0].out.size() / 4; ++i) {
      ASSERT_NEAR(x[i], y[i], 1e-5) << "run " << k << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, VariantBackend, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) {
                           return std::string(backend_name(i.param));
                         });

// ---- NaN and Inf inside the window. ----

using testing::Poison;

class VariantNonFinite : public ::testing::TestWithParam<NonFiniteParam> {};

// NaN or +-Inf in q, or in a K row inside the window, gives NaN in all of that head's out and in
// its lse, with a soft-cap too (tanh of an infinite logit is finite, and must not hide it); the
// other heads keep the reference's results and an empty context keeps out = 0, lse = the sink.
TEST_P(VariantNonFinite, GivesNaNInTheHeadsItReaches) {
  const auto [backend, dtype, poison] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Sequence 0 is split; its window (1000 tokens) spans several splits. Sequence 1 ends inside a
  // block, sequence 2 is empty.
  const testing::CaseSpec spec = variant_spec(dtype, 128, 16, 4, {3000, 37, 0});
  const int H = spec.num_heads, KV = spec.num_kv_heads, G = H / KV, D = spec.head_dim;
  const int BS = spec.block_size;
  const testing::HostCase clean = testing::make_case(spec);
  for (const Variants& v :
       {Variants{-1, 30.f, {}, {}}, Variants{1000, 30.f, alibi_slopes(H), sink_logits(H)}}) {
    SCOPED_TRACE(std::string(poison_name(poison)) + " " + describe(v));
    testing::HostCase c = clean;
    const float bad = poison_value(poison);
    std::vector<bool> bad_head(static_cast<std::size_t>(spec.batch) * H, false);
    auto poison_k_row = [&](int b, int t, int kv, int d) {
      const int id = table_entry(c, b, t / BS);
      const std::size_t i = ((static_cast<std::size_t>(id) * KV + kv) * BS + t % BS) * D + d;
      store_from_float(c.k.data(), dtype, i, bad);
      for (int g = 0; g < G; ++g) bad_head[static_cast<std::size_t>(b) * H + kv * G + g] = true;
    };
    switch (poison) {
      case Poison::kQNaN:
      case Poison::kQPosInf:
      case Poison::kQNegInf:
        store_from_float(c.q.data(), dtype, (0 * H + 5) * static_cast<std::size_t>(D) + 7, bad);
        bad_head[0 * H + 5] = true;
        store_from_float(c.q.data(), dtype, (2 * H + 1) * static_cast<std::size_t>(D) + 3, bad);
        break;
      case Poison::kKNaN:
      case Poison::kKPosInf:
      case Poison::kKNegInf:
        poison_k_row(0, 2500, 0, 11);  // inside the window, in an earlier split than the last
        break;
      case Poison::kKLastRowPosInf:
        poison_k_row(1, 36, 1, 0);
        break;
    }
    const ReferenceResult ref = variant_reference(c, v);
    poison_before_window(c, v.window_left);
    // Finite sentinels (0x3F bytes are finite in every dtype): a NaN read back was written.
    std::fill(c.out.begin(), c.out.end(), std::uint8_t{0x3F});
    std::fill(c.lse.begin(), c.lse.end(), 12345.f);
    run_variant_decode(c, v, backend);

    expect_nan_in_poisoned_heads(c, ref, bad_head);
  }
}

INSTANTIATE_TEST_SUITE_P(All, VariantNonFinite, non_finite_params(Poison::kKLastRowPosInf),
                         non_finite_name);

// ---- Argument errors: typed, naming the field, nothing written. ----

struct BadVariant {
  std::string what;
  Variants v;
  std::string argument;  // what Error::argument() names
  std::string message;   // a part of the message
};

std::vector<BadVariant> bad_variants() {
  const std::vector<float> ok(4, 0.5f);
  auto with = [](std::vector<float> x, int i, float value) {
    x[i] = value;
    return x;
  };
  return {
      {"window_left -2", {-2, 0.f, {}, {}}, "window_left", "window_left = -2"},
      {"window_left INT_MIN",
       {std::numeric_limits<int>::min(), 0.f, {}, {}},
       "window_left",
       "window_left = -2147483648"},
      {"negative soft-cap", {-1, -1.f, {}, {}}, "logits_soft_cap", "logits_soft_cap = -1"},
      {"NaN soft-cap", {-1, kNaN, {}, {}}, "logits_soft_cap", "logits_soft_cap = nan"},
      {"infinite soft-cap", {-1, kInf, {}, {}}, "logits_soft_cap", "logits_soft_cap = inf"},
      {"NaN slope", {-1, 0.f, with(ok, 2, kNaN), {}}, "alibi_slopes[2]", "alibi_slopes[2] = nan"},
      {"infinite slope", {-1, 0.f, with(ok, 0, -kInf), {}}, "alibi_slopes[0]", "alibi_slopes[0]"},
      {"NaN sink", {-1, 0.f, {}, with(ok, 1, kNaN)}, "sinks[1]", "sinks[1] = nan"},
      {"+inf sink", {-1, 0.f, {}, with(ok, 3, kInf)}, "sinks[3]", "sinks[3] = inf"},
  };
}

TEST(VariantValidation, BadVariantArgumentsAreErrorsAndWriteNothing) {
  for (const BadVariant& k : bad_variants()) {
    SCOPED_TRACE(k.what);
    testing::HostCase c = small_case();
    std::fill(c.out.begin(), c.out.end(), std::uint8_t{0x3F});
    std::fill(c.lse.begin(), c.lse.end(), 12345.f);
    const Unwritten unwritten(c);
    const DecodeArgs a = with_variants(c.args(), k.v);
    DecodeOptions o;
    o.backend = Backend::kCpu;
    expect_error([&] { decode(a, o); }, ErrorCode::kInvalidArgument, k.argument, {k.message},
                 "decode with " + k.what);
    unwritten.check();
    // The reference validates the same way.
    try {
      reference_decode(a);
      ADD_FAILURE() << "the reference accepted " << k.what;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), k.argument) << e.what();
    }
  }
}

// The values the variants allow at their edges: no window (-1), no cap (0), a -inf sink, slopes
// of 0 and negative ones.
// The log2-unit soft-cap of the CUDA kernels (host build of the same function): an absolute error
// of a few ulps of the cap over the whole range, saturating at +-cap, NaN kept, and the
// window and sink helpers at their edges.
TEST(VariantMath, SoftCapLog2IsTanhToAFewUlpsOfTheCap) {
  for (const double cap : {1e-3, 1.0, 30.0, 50.0, 1e6}) {
    const float cap2 = static_cast<float>(cap * kLog2e);
    const float k = soft_cap_exp2_scale(cap2);
    for (double s = -200 * cap; s <= 200 * cap; s += cap / 64) {
      const double got = soft_cap_log2(static_cast<float>(s * kLog2e), cap2, k) / kLog2e;
      EXPECT_NEAR(got, soft_cap(s, cap), 4e-7 * cap) << "cap " << cap << " s " << s;
    }
    EXPECT_EQ(soft_cap_log2(INFINITY, cap2, k), cap2);
    EXPECT_EQ(soft_cap_log2(-INFINITY, cap2, k), -cap2);
    EXPECT_TRUE(std::isnan(soft_cap_log2(NAN, cap2, k)));
  }
}

TEST(VariantMath, WindowAndSinkHelpers) {
  EXPECT_EQ(window_first_token(0, 5), 0);
  EXPECT_EQ(window_first_token(10, -1), 0);
  EXPECT_EQ(window_first_token(10, 0), 9);
  EXPECT_EQ(window_first_token(10, 8), 1);
  EXPECT_EQ(window_first_token(10, 9), 0);
  EXPECT_EQ(window_first_token(10, 1000), 0);
  EXPECT_EQ(window_first_block(35, 3, 16), 1);  // tokens 31..34: blocks 1 and 2
  SoftmaxState empty = SoftmaxState::empty();
  EXPECT_EQ(add_sink(empty, 2.5f), 0.f);  // the accumulator (0) is scaled away
  EXPECT_EQ(empty.lse(), 2.5f);
  SoftmaxState st{1.f, 2.f};
  EXPECT_EQ(add_sink(st, -INFINITY), 1.f);
  EXPECT_EQ(st.m, 1.f);
  EXPECT_EQ(st.l, 2.f);
  const float fa = add_sink(st, 3.f);
  EXPECT_FLOAT_EQ(fa, std::exp(1.f - 3.f));
  EXPECT_FLOAT_EQ(st.lse(), std::log(2 * std::exp(1.0) + std::exp(3.0)));
}

TEST(VariantValidation, EdgeValuesAreAccepted) {
  testing::HostCase c = small_case();
  const Variants v{-1, 0.f, {0.f, -0.25f, 1.f, 0.f}, {-kInf, 0.f, -100.f, 50.f}};
  check_variant(c, v, Backend::kCpu);
}

// ---- The CUDA backend's own paths: checked mode and device-resident variant values. ----

// Every CUDA test here (and the CUDA rows above) uses device copies; the window and soft-cap
// errors come from the shapes' validation, the slope and sink values are read back only with
// cuda_checked.
TEST(VariantCuda, BadVariantArgumentsAreErrorsAndWriteNothing) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const BadVariant& k : bad_variants()) {
    SCOPED_TRACE(k.what);
    testing::HostCase c = small_case();
    std::fill(c.out.begin(), c.out.end(), std::uint8_t{0x3F});
    testing::DeviceCase dev(c.args());
    testing::DeviceBuffer slopes, sinks;
    DecodeArgs a = dev.args();
    a.window_left = k.v.window_left;
    a.logits_soft_cap = k.v.soft_cap;
    if (!k.v.slopes.empty()) {
      slopes = testing::DeviceBuffer(k.v.slopes.data(), k.v.slopes.size() * sizeof(float));
      a.alibi_slopes = slopes.as<const float>();
    }
    if (!k.v.sinks.empty()) {
      sinks = testing::DeviceBuffer(k.v.sinks.data(), k.v.sinks.size() * sizeof(float));
      a.sinks = sinks.as<const float>();
    }
    DecodeOptions o;
    o.backend = Backend::kCuda;
    o.cuda_checked = true;
    expect_error([&] { decode(a, o); }, ErrorCode::kInvalidArgument, k.argument, {},
                 "decode with " + k.what);
    std::vector<std::uint8_t> out(c.out.size());
    testing::copy_to_host(out.data(), a.out, out.size());
    EXPECT_EQ(out, c.out) << "out was written";
  }
}

// Checked mode validates only the table entries from the window's first block on: the garbage
// before the window is accepted, and the results match.
TEST(VariantCuda, CheckedModeIgnoresTableEntriesBeforeTheWindow) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const testing::HostCase clean =
      testing::make_case(variant_spec(DType::kBF16, 128, 16, 8, {4000, 0, 300, 17}));
  const int H = clean.spec.num_heads;
  for (const Variants& v :
       {Variants{100, 0.f, {}, {}}, Variants{1000, 30.f, alibi_slopes(H), sink_logits(H)}}) {
    testing::HostCase c = clean;
    const ReferenceResult ref = variant_reference(c, v);
    poison_before_window(c, v.window_left);
    detail::DecodeOptions o;
    o.cuda_checked = true;
    run_variant_decode(c, v, Backend::kCuda, o);
    expect_matches(c, ref, "checked " + describe(v));
  }
}

// ---- Context-parallel decode. ----

// A rank holds only a share of each context, so the variants that depend on token positions or
// must count once per sequence are refused, by name, on every rank; when a single rank sets one,
// it names the argument and the others name that rank. Nothing is written.
TEST(VariantContextParallel, WindowAlibiAndSinksAreRefusedOnEveryRank) {
  testing::CaseSpec spec;
  spec.batch = 2;
  spec.context_lens = {40, 7};
  spec.seed = testing::seed_for_test();
  const testing::HostCase base = testing::make_case(spec);
  const int H = spec.num_heads;
  const std::vector<std::pair<std::string, Variants>> refused = {
      {"window_left", {0, 0.f, {}, {}}},
      {"window_left", {100, 30.f, {}, {}}},
      {"alibi_slopes", {-1, 0.f, alibi_slopes(H), {}}},
      {"sinks", {-1, 0.f, {}, sink_logits(H)}},
  };
  DecodeOptions cpu;
  cpu.backend = Backend::kCpu;
  for (const auto& [name, v] : refused) {
    for (int ranks : {1, 2, 3}) {
      for (int only : {-1, ranks - 1}) {  // every rank sets it, or the last one only
        if (only >= 0 && ranks == 1) continue;
        SCOPED_TRACE(describe(v) + " ranks " + std::to_string(ranks) +
                     (only < 0 ? " on every rank" : " on the last rank"));
        std::vector<testing::HostCase> cases(ranks, base);
        const auto errors = run_on_every_rank(ranks, [&](int r, Communicator& comm) {
          const DecodeArgs a =
              only < 0 || r == only ? with_variants(cases[r].args(), v) : cases[r].args();
          context_parallel_decode(a, comm, cpu);
        });
        for (int r = 0; r < ranks; ++r) {
          ASSERT_TRUE(errors[r].thrown) << "rank " << r << " accepted it";
          if (only < 0 || r == only) {
            EXPECT_EQ(errors[r].code, ErrorCode::kUnsupported) << "rank " << r;
            EXPECT_EQ(errors[r].argument, name) << "rank " << r;
          } else {
            EXPECT_EQ(errors[r].argument, "rank") << "rank " << r;
          }
          EXPECT_TRUE(cases[r].out == base.out) << "rank " << r << " wrote out";
        }
      }
    }
  }
}

// The soft-cap acts on each logit alone, so each rank's share decodes with it: every rank gets
// the reference of the whole contexts with the cap, the same bits on every rank.
TEST(VariantContextParallel, SoftCapMatchesTheReferenceOnEveryRank) {
  testing::CaseSpec spec = testing::shaped_spec(DType::kBF16, 8, 2, 64, 16, {1000, 37, 0, 16, 300});
  spec.magnitude = 3.f;
  spec.seed = testing::seed_for_test();
  const testing::HostCase c = testing::make_case(spec);
  const Variants v{-1, 5.f, {}, {}};
  const ReferenceResult ref = variant_reference(c, v);
  std::mt19937 rng(static_cast<std::uint32_t>(spec.seed));
  for (int ranks : {2, 3}) {
    for (testing::Share how : {testing::Share::kRanges, testing::Share::kStrides}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks" +
                   (how == testing::Share::kRanges ? " ranges" : " strides"));
      const std::vector<testing::RankShare> shares = testing::share_out(c, ranks, how, rng);
      std::vector<testing::HostCase> results(ranks, c);
      const auto errors = run_on_every_rank(ranks, [&](int r, Communicator& comm) {
        testing::HostCase& mine = results[r];
        mine.poison_outputs();
        DecodeArgs a = with_variants(mine.args(), v);
        a.block_table = shares[r].table.data();
        a.context_lens = shares[r].lens.data();
        DecodeOptions o;
        o.backend = Backend::kCpu;
        o.num_threads = 1;
        context_parallel_decode(a, comm, o);
      });
      for (int r = 0; r < ranks; ++r) {
        ASSERT_FALSE(errors[r].thrown) << "rank " << r << ": " << errors[r].argument;
        expect_matches(results[r], ref, "rank " + std::to_string(r));
        EXPECT_TRUE(results[r].out == results[0].out) << "ranks disagree";
        EXPECT_TRUE(results[r].lse == results[0].lse) << "ranks disagree";
      }
    }
  }
}

}  // namespace
}  // namespace pagedattn
