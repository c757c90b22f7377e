// The bugs planted around the CPU backend (testing/planted_faults.hpp), which the fuzzer must
// catch: each changes exactly the outputs its bug reaches, and no fault changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/testing/planted_faults.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::Fault;

detail::DecodeOptions cpu_options() {
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  return o;
}

// out and lse of the case after a run with `fault`, from freshly poisoned outputs.
struct Outputs {
  std::vector<float> out, lse;
};
Outputs run(testing::HostCase& c, Fault fault) {
  c.poison_outputs();
  testing::decode_with_fault(c.args(), cpu_options(), fault);
  Outputs r{std::vector<float>(c.out.size() / sizeof(float)), c.lse};
  std::memcpy(r.out.data(), c.out.data(), c.out.size());
  return r;
}

// Whether (sequence b, head h)'s out row and lse are the same bits in both runs.
bool same_row(const Outputs& x, const Outputs& y, int b, int h, int H, int D) {
  const std::size_t row = static_cast<std::size_t>(b) * H + h;
  return std::memcmp(&x.out[row * D], &y.out[row * D], D * sizeof(float)) == 0 &&
         std::memcmp(&x.lse[row], &y.lse[row], sizeof(float)) == 0;
}

testing::CaseSpec spec(std::vector<int> lens, std::uint64_t salt) {
  testing::CaseSpec s;
  s.batch = static_cast<int>(lens.size());
  s.num_heads = 8;
  s.num_kv_heads = 4;
  s.head_dim = 64;
  s.block_size = 16;
  s.context_lens = std::move(lens);
  s.seed = testing::seed_for(salt);
  return s;
}

TEST(PlantedFaults, NoneIsThePlainCall) {
  testing::HostCase c = testing::make_case(spec({700, 0, 17, 3000}, 71));
  const Outputs faulty = run(c, Fault::kNone);
  c.poison_outputs();
  detail::decode(c.args(), cpu_options());
  EXPECT_EQ(std::memcmp(faulty.out.data(), c.out.data(), c.out.size()), 0);
  EXPECT_EQ(std::memcmp(faulty.lse.data(), c.lse.data(), c.lse.size() * sizeof(float)), 0);
}

// The slot past a partial last block holds NaN (the case poisons every slot no one may read), so
// exactly the sequences whose last block is partial turn NaN.
TEST(PlantedFaults, LastBlockOffByOneReadsPastPartialLastBlocks) {
  const std::vector<int> lens = {16, 17, 32, 45, 0};
  testing::HostCase c = testing::make_case(spec(lens, 72));
  const Outputs plain = run(c, Fault::kNone);
  const Outputs faulty = run(c, Fault::kLastBlockOffByOne);
  for (int b = 0; b < static_cast<int>(lens.size()); ++b) {
    const bool partial = lens[b] % 16 != 0;
    for (int h = 0; h < 8; ++h) {
      if (partial) {
        EXPECT_TRUE(std::isnan(faulty.lse[b * 8 + h])) << "sequence " << b << " head " << h;
      } else {
        EXPECT_TRUE(same_row(plain, faulty, b, h, 8, 64)) << "sequence " << b << " head " << h;
      }
    }
  }
}

// Heads 2 and 3 (kv head 1 of four, groups of 2) change, every other head keeps its bits.
TEST(PlantedFaults, WrongKvHeadChangesKvHeadOneOnly) {
  testing::HostCase c = testing::make_case(spec({40, 300}, 73));
  const Outputs plain = run(c, Fault::kNone);
  const Outputs faulty = run(c, Fault::kWrongKvHead);
  for (int b = 0; b < 2; ++b) {
    for (int h = 0; h < 8; ++h) {
      EXPECT_EQ(same_row(plain, faulty, b, h, 8, 64), h / 2 != 1)
          << "sequence " << b << " head " << h;
    }
  }
}

// The long sequence is split, the short one not: only the long one changes, to the attention
// over the tokens before its last split.
TEST(PlantedFaults, DropSplitDropsTheLastSplitOfSplitSequences) {
  testing::HostCase c = testing::make_case(spec({3000, 40}, 74));
  const SplitPlan plan = detail::cpu::split_plan(c.args(), cpu_options());
  ASSERT_GT(plan.num_splits[0], 1);
  ASSERT_EQ(plan.num_splits[1], 1);
  int kept = 0;
  for (const WorkItem& it : plan.items) {
    if (it.seq == 0 && it.split == plan.num_splits[0] - 1) kept = it.block_begin * 16;
  }
  const Outputs plain = run(c, Fault::kNone);
  const Outputs faulty = run(c, Fault::kDropSplit);
  for (int h = 0; h < 8; ++h) {
    EXPECT_FALSE(same_row(plain, faulty, 0, h, 8, 64)) << "head " << h;
    EXPECT_TRUE(same_row(plain, faulty, 1, h, 8, 64)) << "head " << h;
  }
  // The long sequence alone, its context cut where the last split began.
  c.context_lens[0] = kept;
  DecodeArgs a = c.args();
  a.batch = 1;
  c.poison_outputs();
  detail::decode(a, cpu_options());
  EXPECT_EQ(std::memcmp(faulty.out.data(), c.out.data(), 8 * 64 * sizeof(float)), 0);
}

}  // namespace
}  // namespace pagedattn
