// Cache layout offsets, block-table views, and the split plan's coverage rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/split_plan.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

TEST(CacheLayout, DenseOffsetsFollowTheSeedLayout) {
  const CacheLayout l = CacheLayout::dense(/*blocks=*/5, /*kv=*/3, /*bs=*/7, /*d=*/80);
  // [num_blocks][num_kv_heads][block_size][head_dim]
  EXPECT_EQ(l.offset(0, 0, 0), 0);
  EXPECT_EQ(l.offset(0, 0, 1), 80);
  EXPECT_EQ(l.offset(0, 1, 0), 7 * 80);
  EXPECT_EQ(l.offset(1, 0, 0), 3 * 7 * 80);
  EXPECT_EQ(l.offset(4, 2, 6), ((4 * 3 + 2) * 7 + 6) * 80);
  EXPECT_EQ(l.elements(), 5 * 3 * 7 * 80);
  EXPECT_EQ(CacheLayout::dense(0, 3, 7, 80).elements(), 0);
}

TEST(CacheLayout, OffsetsDoNotOverflowInt32) {
  const CacheLayout l = CacheLayout::dense(100000, 8, 16, 256);  // 3.3e9 elements
  EXPECT_EQ(l.offset(99999, 7, 15), ((99999LL * 8 + 7) * 16 + 15) * 256);
}

TEST(CacheLayout, BlockTableViewUsesTheRowStride) {
  const std::vector<std::int32_t> data = {1, 2, -1, 9, 3, 4, -1, 9};
  const BlockTableView t{data.data(), /*max_blocks=*/3, /*row_stride=*/4};
  EXPECT_EQ(t.block(0, 1), 2);
  EXPECT_EQ(t.block(1, 0), 3);
  EXPECT_EQ(t.row(1)[1], 4);
}

TEST(CacheLayout, BlockCountsAndValidTokens) {
  EXPECT_EQ(blocks_for(0, 16), 0);
  EXPECT_EQ(blocks_for(1, 16), 1);
  EXPECT_EQ(blocks_for(16, 16), 1);
  EXPECT_EQ(blocks_for(17, 16), 2);
  EXPECT_EQ(valid_in_block(17, 16, 0), 16);
  EXPECT_EQ(valid_in_block(17, 16, 1), 1);
  EXPECT_EQ(valid_in_block(32, 16, 1), 16);
  EXPECT_EQ(valid_in_block(5, 1, 4), 1);
}

// Every (sequence, kv head) has its blocks covered exactly once, in split order.
void expect_covers(const SplitPlan& p, const std::vector<std::int32_t>& lens, int kv, int bs) {
  std::size_t item = 0;
  for (int b = 0; b < static_cast<int>(lens.size()); ++b) {
    const int nb = blocks_for(lens[b], bs);
    EXPECT_EQ(p.split_offset[b + 1] - p.split_offset[b], p.num_splits[b]);
    if (nb == 0) EXPECT_EQ(p.num_splits[b], 0);
    for (int h = 0; h < kv; ++h) {
      int next = 0;
      for (int s = 0; s < p.num_splits[b]; ++s, ++item) {
        ASSERT_LT(item, p.items.size());
        const WorkItem& it = p.items[item];
        EXPECT_EQ(it.seq, b);
        EXPECT_EQ(it.kv_head, h);
        EXPECT_EQ(it.split, s);
        EXPECT_EQ(it.block_begin, next);
        EXPECT_GT(it.block_end, it.block_begin);
        EXPECT_LE(it.block_end - it.block_begin, p.chunk_blocks);
        next = it.block_end;
      }
      EXPECT_EQ(next, nb);
    }
  }
  EXPECT_EQ(item, p.items.size());
}

TEST(SplitPlan, CoversEveryBlockExactlyOnce) {
  const std::uint64_t seed = testing::seed_for(31);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = static_cast<int>(rng() % 12), kv = 1 + static_cast<int>(rng() % 8);
    const int bs = 1 + static_cast<int>(rng() % 64);
    std::vector<std::int32_t> lens(batch);
    for (auto& L : lens) L = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 20000);
    PlanOptions o;
    o.parallelism = 1 + static_cast<int>(rng() % 512);
    o.min_chunk_tokens = static_cast<int>(rng() % 1024);
    o.single_split = rng() % 5 == 0;
    const SplitPlan p = make_split_plan(lens.data(), batch, kv, bs, o);
    SCOPED_TRACE(testing::seed_note(seed) + " trial " + std::to_string(trial));
    expect_covers(p, lens, kv, bs);
    if (o.single_split) {
      for (int n : p.num_splits) EXPECT_LE(n, 1);
    }
    for (int n : p.num_splits) EXPECT_LE(n, o.max_splits_per_seq);
  }
}

TEST(SplitPlan, LongSequenceInASkewedBatchGetsManySplits) {
  std::vector<std::int32_t> lens(64, 1024);
  lens[17] = 131072;
  PlanOptions o;
  o.parallelism = 132 * 2;
  o.min_chunk_tokens = 256;
  const SplitPlan p = make_split_plan(lens.data(), 64, 8, 16, o);
  // One chunk size for the batch: the long sequence is cut like the short ones.
  EXPECT_GT(p.num_splits[17], 16);
  // No item is longer than the machine's fair share of the total work.
  const int total_blocks = 63 * 64 + 131072 / 16;
  EXPECT_LE(p.chunk_blocks, (8 * total_blocks + o.parallelism - 1) / o.parallelism);
  EXPECT_EQ(p.num_splits[0], blocks_for(64, p.chunk_blocks));
}

// A sequence's splits differ by at most one block: no short remainder split.
TEST(SplitPlan, SplitsOfASequenceAreBalanced) {
  const std::uint64_t seed = testing::seed_for(32);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int nb = 1 + static_cast<int>(rng() % 5000);
    const int chunk = 1 + static_cast<int>(rng() % 700);
    const int ns = splits_for(nb, chunk);
    SCOPED_TRACE(testing::seed_note(seed) + " nb " + std::to_string(nb) + " chunk " +
                 std::to_string(chunk));
    ASSERT_EQ(ns, (nb + chunk - 1) / chunk);
    int lo = nb, hi = 0, next = 0;
    for (int s = 0; s < ns; ++s) {
      int begin = -1, end = -1;
      split_block_range(nb, chunk, s, &begin, &end);
      EXPECT_EQ(begin, next);
      lo = std::min(lo, end - begin);
      hi = std::max(hi, end - begin);
      next = end;
    }
    EXPECT_EQ(next, nb);
    EXPECT_GE(lo, 1);
    EXPECT_LE(hi, chunk);
    EXPECT_LE(hi - lo, 1);
  }
  EXPECT_EQ(splits_for(0, 8), 0);
}

// A few long sequences fill whole waves: items stay within the parallelism instead of spilling
// a handful into one more wave (the rounding slack is planned for).
TEST(SplitPlan, FewLongSequencesStayWithinTheParallelism) {
  PlanOptions o;
  o.parallelism = 528;  // 132 SMs x 2 CTAs x 2 waves
  o.min_chunk_tokens = 128;
  o.max_splits_per_seq = 1024;
  for (const auto& shape : std::vector<std::pair<int, int>>{
           {1, 131072}, {1, 32768}, {8, 32768}, {2, 100000}, {4, 4096}}) {
    const std::vector<std::int32_t> lens(shape.first, shape.second);
    const SplitPlan p = make_split_plan(lens.data(), shape.first, 8, 16, o);
    SCOPED_TRACE("batch " + std::to_string(shape.first) + " ctx " + std::to_string(shape.second));
    EXPECT_LE(static_cast<int>(p.items.size()), o.parallelism);
    EXPECT_GE(static_cast<int>(p.items.size()), o.parallelism * 3 / 4);
  }
  // One 131072-token sequence with 8 kv heads: its balanced splits cover every block once and
  // differ by at most one block, none above the chunk.
  const std::vector<std::int32_t> one(1, 131072);
  const SplitPlan p = make_split_plan(one.data(), 1, 8, 16, o);
  const int nb = 131072 / 16;
  ASSERT_GE(p.num_splits[0], 1);
  int covered = 0, smallest = nb, largest = 0;
  for (const WorkItem& it : p.items) {
    if (it.kv_head != 0) continue;
    EXPECT_EQ(it.block_begin, covered);
    covered = it.block_end;
    smallest = std::min(smallest, it.block_end - it.block_begin);
    largest = std::max(largest, it.block_end - it.block_begin);
  }
  EXPECT_EQ(covered, nb);
  EXPECT_LE(largest - smallest, 1);
  EXPECT_LE(largest, p.chunk_blocks);
}

// even_waves (the CUDA backend's plans): a batch of similar lengths becomes at most one wave of
// equal items, and nothing is split once batch x kv heads fills the machine; a skewed batch keeps
// the plain rule, which gives its long sequence many splits.
TEST(SplitPlan, EvenWavesFillOneWaveOfEqualItems) {
  PlanOptions o;
  o.parallelism = 264;  // 132 SMs x 2 CTAs
  o.min_chunk_tokens = 256;
  o.max_splits_per_seq = 1024;
  o.even_waves = true;
  for (const auto& shape : std::vector<std::pair<int, int>>{{1, 131072},
                                                            {1, 32768},
                                                            {8, 32768},
                                                            {8, 4096},
                                                            {32, 1024},
                                                            {32, 4096},
                                                            {32, 16384},
                                                            {64, 4096},
                                                            {128, 1024}}) {
    const std::vector<std::int32_t> lens(shape.first, shape.second);
    const SplitPlan p = make_split_plan(lens.data(), shape.first, 8, 16, o);
    SCOPED_TRACE("batch " + std::to_string(shape.first) + " ctx " + std::to_string(shape.second));
    const int items = static_cast<int>(p.items.size());
    if (shape.first * 8 >= o.parallelism / 2) {
      EXPECT_EQ(items, shape.first * 8);  // one item per (sequence, kv head)
    } else {
      EXPECT_LE(items, o.parallelism);
      EXPECT_GE(items, o.parallelism / 2);
    }
    int smallest = 1 << 30, largest = 0;
    for (const WorkItem& it : p.items) {
      smallest = std::min(smallest, it.block_end - it.block_begin);
      largest = std::max(largest, it.block_end - it.block_begin);
    }
    EXPECT_LE(largest - smallest, 1);
  }
  std::vector<std::int32_t> skew(64, 1024);
  skew[0] = 131072;
  const SplitPlan p = make_split_plan(skew.data(), 64, 8, 16, o);
  EXPECT_GT(p.num_splits[0], 16);
  EXPECT_EQ(p.num_splits[1], 1);
}

TEST(SplitPlan, PartialIndicesAreDisjoint) {
  const std::vector<std::int32_t> lens = {5000, 0, 300, 70000};
  PlanOptions o;
  o.parallelism = 64;
  const SplitPlan p = make_split_plan(lens.data(), 4, 2, 16, o);
  const int H = 8;
  std::vector<int> seen(p.num_partials(H), 0);
  for (int b = 0; b < 4; ++b) {
    for (int s = 0; s < p.num_splits[b]; ++s) {
      for (int h = 0; h < H; ++h) ++seen.at(p.partial_index(b, s, h, H));
    }
  }
  for (int c : seen) EXPECT_EQ(c, 1);
}

}  // namespace
}  // namespace pagedattn
