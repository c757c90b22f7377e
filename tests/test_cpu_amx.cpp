// The AMX kernel (cpu/isa_amx.cpp: Q.K as _tile_dpbf16ps on a bf16 q and cache, and P.V too with
// bf16 weights) against the f64 reference, called directly through kernel_for_isa("amx") whatever
// PAGEDATTN_CPU_ISA picks: GQA groups 8 to 64, head dims 64 to 512, block sizes 1 to 32 with
// contexts that end inside a block, the attention variants the kernel applies, and non-finite K
// rows; and through decode() with several query tokens per sequence, whose rows per kv head pick
// the kernel's tiles of 8 or 16 heads. Skipped where the build has no AMX kernel or the CPU (or
// the operating system) offers no AMX.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu_kernel.hpp"
#include "isa_choice.hpp"
#include "kernel_context.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/poison.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "pagedattn/variants.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

using detail::cpu::KernelFn;

constexpr const char* kNoAmx =
    "no AMX kernel here: the build lacks -mamx-tile/-mamx-bf16, or the CPU lacks AMX-TILE, "
    "AMX-BF16 or AVX-512 BF16, or the operating system refused the tile state";

// Two kv heads of `group` query heads each, a bf16 q and cache, an f32 out.
testing::CaseSpec amx_spec(int group, int head_dim, int block_size, std::vector<int> lens,
                           std::uint64_t salt) {
  testing::CaseSpec s =
      testing::shaped_spec(DType::kBF16, 2 * group, 2, head_dim, block_size, std::move(lens));
  s.out_dtype = DType::kF32;
  s.table_padding = 2;
  s.spare_blocks = 4;
  s.seed = testing::seed_for(salt);
  return s;
}

struct KernelResult {
  std::vector<float> out;  // [batch][heads][head_dim]
  std::vector<float> lse;  // [batch][heads]
};

// Runs `fn` over each sequence's attended blocks as one item covering every kv head (the
// backend's path, with the q buffer) and finalizes in f32 as the backend does, without sinks.
// bf16_weights: the weights may be rounded to bf16 for P.V (the backend's setting for a bf16
// out: the AMX kernel then takes P.V on tiles too).
KernelResult run_kernel(const DecodeArgs& a, KernelFn fn, bool bf16_weights) {
  const int H = a.num_heads, D = a.head_dim;
  std::vector<float> q;
  detail::cpu::ItemContext ctx = item_context(a, q);
  ctx.bf16_weights = bf16_weights;
  alignas(64) float scores[detail::cpu::kHeadTile * 256];
  std::vector<float> m(H), l(H), acc(static_cast<std::size_t>(H) * D);
  std::vector<float> q_buffer(static_cast<std::size_t>(H) * D + 16);
  KernelResult r{std::vector<float>(static_cast<std::size_t>(a.batch) * H * D),
                 std::vector<float>(static_cast<std::size_t>(a.batch) * H)};
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    const WorkItem item{b, 0, 0, window_first_block(L, a.window_left, a.block_size),
                        blocks_for(L, a.block_size)};
    fn(ctx, item, a.num_kv_heads, m.data(), l.data(), acc.data(),
       detail::cpu::ItemScratch{scores, q_buffer.data()});
    for (int h = 0; h < H; ++h) {
      const SoftmaxState st{m[h], l[h]};
      const std::size_t row = static_cast<std::size_t>(b) * H + h;
      const bool nan = std::isnan(st.l);
      const float inv = nan ? NAN : st.inv_sum();
      for (int d = 0; d < D; ++d)
        r.out[row * D + d] = acc[static_cast<std::size_t>(h) * D + d] * inv;
      r.lse[row] = nan ? NAN : st.lse();
    }
  }
  return r;
}

// The AMX kernel's result against the f64 reference at the f32 tolerance, or the bf16 one with
// bf16 weights (NaN exactly where the reference has NaN), and against the AVX-512 kernel's: some
// output must differ in its last bits, or the tile path did not run (the AVX-512 kernel takes Q.K
// on the pre-scaled f32 q).
void expect_amx_matches_reference(const testing::CaseSpec& spec, bool bf16_weights,
                                  const Variants& v = {}, testing::HostCase* poisoned = nullptr) {
  testing::HostCase c = poisoned != nullptr ? *poisoned : testing::make_case(spec);
  const DecodeArgs a = with_variants(c.args(), v);
  const ReferenceResult ref = reference_decode(a);
  const KernelResult got = run_kernel(a, detail::cpu::kernel_for_isa("amx"), bf16_weights);
  const KernelResult avx512 = run_kernel(a, detail::cpu::kernel_for_isa("avx512"), false);
  SCOPED_TRACE(testing::describe(spec) + " " + describe(v) + " " + testing::seed_note(spec.seed) +
               (bf16_weights ? " bf16 weights" : ""));
  double scale = 1e-30, err = 0, lse_err = 0;
  std::size_t differs = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    if (std::isnan(ref.out[i])) {
      EXPECT_TRUE(std::isnan(got.out[i])) << "out " << i;
      continue;
    }
    scale = std::max(scale, std::fabs(ref.out[i]));
    // A NaN difference counts as infinite (std::max would drop it).
    const double diff = std::fabs(got.out[i] - ref.out[i]);
    err = std::isnan(diff) ? INFINITY : std::max(err, diff);
    differs += got.out[i] != avx512.out[i];
  }
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isnan(ref.lse[i]) || std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isnan(ref.lse[i]) ? std::isnan(got.lse[i]) : got.lse[i] == ref.lse[i])
          << "lse " << i;
    } else {
      const double diff = std::fabs(got.lse[i] - ref.lse[i]);
      lse_err = std::isnan(diff) ? INFINITY : std::max(lse_err, diff);
    }
  }
  EXPECT_LE(err / scale, testing::out_tolerance(bf16_weights ? DType::kBF16 : DType::kF32));
  EXPECT_LE(lse_err, testing::lse_tolerance());
  if (scale > 1e-30) EXPECT_GT(differs, 0u) << "the AMX kernel gave the AVX-512 kernel's bits";
}

TEST(CpuAmx, TileScoresMatchTheReference) {
  if (detail::cpu::kernel_for_isa("amx") == nullptr) GTEST_SKIP() << kNoAmx;
  // Contexts: empty, one token, a partial last block, several full blocks and a partial one.
  std::uint64_t salt = 1;
  for (int group : {8, 16, 32, 64}) {
    for (int d : {64, 128}) {
      for (int bs : {1, 16, 7, 32}) {
        const testing::CaseSpec spec = amx_spec(group, d, bs, {0, 1, 17, 97, 301}, salt++);
        for (bool bf16_weights : {false, true}) expect_amx_matches_reference(spec, bf16_weights);
      }
    }
  }
  for (bool bf16_weights : {false, true}) {
    expect_amx_matches_reference(amx_spec(8, 256, 16, {600, 33}, salt++), bf16_weights);
    // Head dim 512: tiles of 8 and of 16 heads block by block (past the steps' buffers).
    for (int group : {8, 16}) {
      expect_amx_matches_reference(amx_spec(group, 512, 16, {300, 33, 1}, salt++), bf16_weights);
    }
  }
}

TEST(CpuAmx, AppliesTheVariants) {
  if (detail::cpu::kernel_for_isa("amx") == nullptr) GTEST_SKIP() << kNoAmx;
  std::uint64_t salt = 100;
  for (int bs : {16, 7}) {
    const testing::CaseSpec spec = amx_spec(16, 128, bs, {700, 1, bs + 1, 37}, salt++);
    const int H = spec.num_heads;
    std::vector<Variants> configs(5);
    configs[0].window_left = bs + 1;
    configs[1].window_left = 300;
    configs[2].soft_cap = 5.f;
    configs[3].slopes = alibi_slopes(H);
    configs[4] = {300, 30.f, alibi_slopes(H), {}};
    for (const Variants& v : configs) {
      for (bool bf16_weights : {false, true}) expect_amx_matches_reference(spec, bf16_weights, v);
    }
  }
}

TEST(CpuAmx, NonFiniteKRowMakesItsSequenceNaN) {
  if (detail::cpu::kernel_for_isa("amx") == nullptr) GTEST_SKIP() << kNoAmx;
  // NaN K and V rows inside the context of sequence 0 (a full 16-token step and, at 40, the
  // partial last one) reach every head of that sequence; sequence 1 stays finite.
  const testing::CaseSpec spec = amx_spec(8, 64, 16, {41, 50}, 300);
  for (int t : {3, 40}) {
    testing::HostCase c = testing::make_case(spec);
    testing::store_nan_tokens(c, 0, t, t + 1);
    for (bool bf16_weights : {false, true})
      expect_amx_matches_reference(spec, bf16_weights, {}, &c);
  }
}

// Tiles of 16 heads with bf16 weights run in steps of 32 tokens (cpu/amx_steps.hpp): whole blocks
// per step (32 of 1, four of 8, two of 16, one of 24 or 32; blocks of 64 take the block-by-block
// path), contexts that end inside a step's first or second block or at its end, odd block counts,
// one and two tiles of heads per step (group 16, 32 and 48: a pair, then one), head dims 64 to
// 256 (the largest the step's buffers hold: 512 runs block by block, TileScoresMatchTheReference).
TEST(CpuAmx, StepsOfBlocksMatchTheReference) {
  if (detail::cpu::kernel_for_isa("amx") == nullptr) GTEST_SKIP() << kNoAmx;
  const std::vector<int> lens = {16, 17, 31, 32, 33, 48, 63, 65, 200};
  std::uint64_t salt = 500;
  for (int bs : {1, 8, 16, 24, 32, 64})
    expect_amx_matches_reference(amx_spec(32, 128, bs, lens, salt++), true);
  for (int d : {64, 96, 192, 256})
    expect_amx_matches_reference(amx_spec(16, d, 16, lens, salt++), true);
  expect_amx_matches_reference(amx_spec(48, 64, 16, lens, salt++), true);
}

// NaN K and V rows in the steps of 32 tokens: in a step's first block and its second, in a last
// partial step, and in a 16-token part that spans blocks (block size 7, copied row by row).
TEST(CpuAmx, NonFiniteRowInAStepMakesItsSequenceNaN) {
  if (detail::cpu::kernel_for_isa("amx") == nullptr) GTEST_SKIP() << kNoAmx;
  std::uint64_t salt = 600;
  for (int group : {16, 32}) {
    for (int bs : {16, 7}) {
      const testing::CaseSpec spec = amx_spec(group, 64, bs, {41, 50}, salt++);
      for (int t : {3, 20, 40}) {
        testing::HostCase c = testing::make_case(spec);
        testing::store_nan_tokens(c, 0, t, t + 1);
        expect_amx_matches_reference(spec, true, {}, &c);
      }
    }
  }
}

// Query tokens together (q_indptr): a kv head's rows are the call's most query tokens x the
// group, in tiles of 16 heads where they come in sixteens (group 4 at 4 and 8 tokens, group 8 at
// 2, group 16 at 1) and of 8 otherwise (group 4 at 2, group 8 at 1). Through decode() on the CPU
// backend against the f64 reference: contexts 0 and 1 (queries before the context), ones ending
// inside a block and crossing several, a sequence with fewer query tokens than the call's most
// (padding rows), NaN in every cache slot no query may read; bf16 and f32 outs (P.V on tiles with
// the bf16 one).
// A case of query tokens together: `q_len` tokens per sequence, sequence 3 one fewer (padding
// rows), a random bf16 q for all of them, decoded on the CPU backend; NaN in K and V of the
// context tokens [nan_from, nan_to) counted back from each context's end (t = L - nan_from ..).
// The result against the f64 reference: NaN exactly where the reference has NaN (the rows whose
// query attends a NaN token), the rest within the out dtype's tolerance.
void expect_query_tokens_match(const testing::CaseSpec& spec, int q_len, int nan_from = 0,
                               int nan_to = 0) {
  testing::HostCase c = testing::make_case(spec);
  std::vector<std::int32_t> indptr = {0};
  for (int b = 0; b < spec.batch; ++b) {
    indptr.push_back(indptr.back() + (b == 3 ? std::max(1, q_len - 1) : q_len));
  }
  for (int b = 0; b < spec.batch; ++b) {
    const int L = c.context_lens[b];
    if (nan_to > nan_from && L >= nan_to) testing::store_nan_tokens(c, b, L - nan_to, L - nan_from);
  }
  const std::size_t row = static_cast<std::size_t>(spec.num_heads) * spec.head_dim;
  const std::size_t rows = static_cast<std::size_t>(indptr.back());
  std::mt19937_64 rng(spec.seed ^ 0x51a7e5ull);
  std::normal_distribution<float> dist(0.f, spec.magnitude);
  c.q.assign(rows * row * sizeof(bf16_t), 0);
  for (std::size_t i = 0; i < rows * row; ++i) {
    store_from_float(c.q.data(), DType::kBF16, i, dist(rng));
  }
  c.out.assign(rows * row * dtype_size(spec.out_dtype), 0);
  c.lse.assign(rows * spec.num_heads, 0.f);
  c.poison_outputs();
  DecodeArgs a = c.args();
  a.q_indptr = indptr.data();
  a.num_q_tokens = indptr.back();
  a.max_q_len = q_len;
  const ReferenceResult ref = reference_decode(a);
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  detail::decode(a, o);
  SCOPED_TRACE(testing::describe(spec) + " q_len " + std::to_string(q_len) + " NaN tokens " +
               std::to_string(nan_from) + ".." + std::to_string(nan_to) + " from the end " +
               testing::seed_note(spec.seed));
  if (nan_to <= nan_from) {
    const testing::Comparison cmp = testing::compare_outputs(c, ref);
    EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(spec.out_dtype));
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance());
    return;
  }
  double scale = 1e-30, err = 0;
  std::size_t nan_rows = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const float got = spec.out_dtype == DType::kBF16
                          ? to_float(reinterpret_cast<const bf16_t*>(c.out.data())[i])
                          : reinterpret_cast<const float*>(c.out.data())[i];
    if (std::isnan(ref.out[i])) {
      EXPECT_TRUE(std::isnan(got)) << "out " << i;
      nan_rows += i % spec.head_dim == 0;
      continue;
    }
    scale = std::max(scale, std::fabs(ref.out[i]));
    const double diff = std::fabs(got - ref.out[i]);
    err = std::isnan(diff) ? INFINITY : std::max(err, diff);
  }
  EXPECT_GT(nan_rows, 0u) << "no row attends the NaN tokens";
  EXPECT_LT(nan_rows, ref.out.size() / spec.head_dim) << "every row attends the NaN tokens";
  EXPECT_LE(err / scale, testing::out_tolerance(spec.out_dtype));
}

TEST(CpuAmx, QueryTokensTogetherMatchTheReference) {
  if (std::string(detail::cpu::isa().name) != "amx") {
    GTEST_SKIP() << "the CPU backend does not run the AMX kernel here";
  }
  const std::pair<int, int> shapes[] = {{4, 2}, {4, 4}, {4, 8}, {8, 1}, {8, 2}, {16, 1}};
  std::uint64_t salt = 400;
  for (const auto& [group, q_len] : shapes) {
    for (int bs : {16, 7}) {
      for (DType out : {DType::kBF16, DType::kF32}) {
        testing::CaseSpec spec = amx_spec(group, 128, bs, {0, 1, 17, 2 * bs + 3, 301}, salt++);
        spec.out_dtype = out;
        expect_query_tokens_match(spec, q_len);
      }
    }
  }
}

// NaN in context tokens that only the later query tokens attend (the last one, or the last two
// where a sequence has more than two query tokens): the rows of earlier tokens, whose causal bound
// lies before them, stay finite (no P.V tile may multiply their 0 weight by a NaN V row); with
// tiles of 16 heads and bf16 weights the steps of 32 tokens take these contexts, which end inside a
// step's first or second block.
TEST(CpuAmx, QueryTokensSkipNaNPastTheirBound) {
  if (std::string(detail::cpu::isa().name) != "amx") {
    GTEST_SKIP() << "the CPU backend does not run the AMX kernel here";
  }
  const std::pair<int, int> shapes[] = {{4, 4}, {4, 8}, {16, 2}};
  std::uint64_t salt = 700;
  for (const auto& [group, q_len] : shapes) {
    for (int bs : {16, 7}) {
      testing::CaseSpec spec = amx_spec(group, 128, bs, {9, 20, 40, 47, 301}, salt++);
      spec.out_dtype = DType::kBF16;
      expect_query_tokens_match(spec, q_len, 0, 1);
      if (q_len > 2) expect_query_tokens_match(spec, q_len, 0, 2);
    }
  }
}

}  // namespace
}  // namespace pagedattn
