// count_shared_reads: the tokens a step reads per sequence and with each block read once, on
// hand-built tables (forked prefixes, windows, a block at two table positions, context 0), on
// tables that BlockManager forks build, and against a brute-force count on random forked tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "pagedattn/block_manager.hpp"
#include "pagedattn/error.hpp"
#include "pagedattn/shared_blocks.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

// Three sequences forked from one prompt: blocks 0 and 1 shared by all, block 2 by two.
TEST(SharedBlocks, ForkedTablesCountEachBlockOnce) {
  const std::vector<std::int32_t> table = {0, 1, 2, 3,  //
                                           0, 1, 2, 4,  //
                                           0, 1, 5, -1};
  const std::vector<std::int32_t> lens = {60, 50, 40};
  const SharedBlockReads r = count_shared_reads(table.data(), 4, lens.data(), 3, 16);
  EXPECT_EQ(r.per_sequence_tokens, 150);
  EXPECT_EQ(r.distinct_tokens, 16 + 16 + 16 + 12 + 2 + 8);
  EXPECT_EQ(r.shared_blocks, 3);
  // A window of 10 tokens: each reads blocks of its own (sequence 1 block 2's slots 8-15,
  // sequence 2 block 1's slots 14-15), nothing twice.
  const SharedBlockReads w = count_shared_reads(table.data(), 4, lens.data(), 3, 16, 9);
  EXPECT_EQ(w.per_sequence_tokens, 30);
  EXPECT_EQ(w.distinct_tokens, 30);
  EXPECT_EQ(w.shared_blocks, 0);
}

// The slots of a block are a union over its readers, not the most any one reads: two windows
// over the two ends of one block read 8 distinct slots.
TEST(SharedBlocks, ABlockCountsTheUnionOfItsReadersSlots) {
  const std::vector<std::int32_t> table = {0, -1,  //
                                           7, 0};
  const std::vector<std::int32_t> lens = {16, 20};
  const SharedBlockReads r = count_shared_reads(table.data(), 2, lens.data(), 2, 16, 3);
  EXPECT_EQ(r.per_sequence_tokens, 8);
  EXPECT_EQ(r.distinct_tokens, 8);
  EXPECT_EQ(r.shared_blocks, 1);
}

TEST(SharedBlocks, EmptyContextsReadNothing) {
  const std::vector<std::int32_t> table = {-1, -1};
  const std::vector<std::int32_t> lens = {0, 0};
  const SharedBlockReads r = count_shared_reads(table.data(), 1, lens.data(), 2, 16);
  EXPECT_EQ(r.per_sequence_tokens, 0);
  EXPECT_EQ(r.distinct_tokens, 0);
  EXPECT_EQ(r.shared_blocks, 0);
  EXPECT_EQ(count_shared_reads(table.data(), 1, lens.data(), 0, 16).per_sequence_tokens, 0);
}

TEST(SharedBlocks, ABadBlockSizeIsNamed) {
  const std::vector<std::int32_t> table = {0};
  const std::vector<std::int32_t> lens = {1};
  for (int bs : {0, 257}) {
    try {
      count_shared_reads(table.data(), 1, lens.data(), 1, bs);
      ADD_FAILURE() << "block size " << bs << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);  // as decode refuses it
      EXPECT_EQ(e.argument(), "block_size") << e.what();
    }
  }
}

// n-way sampling as BlockManager builds it: a prompt of 100 tokens forked 4 ways, then 20 tokens
// appended to each (the partly filled last prompt block is copied on the first append).
TEST(SharedBlocks, BlockManagerForksShareTheirFullPromptBlocks) {
  BlockManager bm(64, 16);
  bm.add_sequence(0, 100);
  for (BlockManager::SeqId s = 1; s < 4; ++s) bm.fork(0, s);
  for (BlockManager::SeqId s = 0; s < 4; ++s) {
    for (int i = 0; i < 20; ++i) bm.append_token(s);
  }
  const BlockManager::Tables t = bm.tables({0, 1, 2, 3});
  const SharedBlockReads r =
      count_shared_reads(t.block_table.data(), t.max_blocks_per_seq, t.context_lens.data(), 4, 16);
  EXPECT_EQ(r.per_sequence_tokens, 4 * 120);
  EXPECT_EQ(r.distinct_tokens, 96 + 4 * 24);  // 6 shared full blocks, then each its own 24
  EXPECT_EQ(r.shared_blocks, 6);
}

// Random forked tables against a set of (block, slot) pairs.
TEST(SharedBlocks, MatchesABruteForceCount) {
  std::mt19937_64 rng(testing::seed_for(77));
  for (int trial = 0; trial < 200; ++trial) {
    const int bs = 1 + static_cast<int>(rng() % 32), batch = 1 + static_cast<int>(rng() % 8);
    const int width = 1 + static_cast<int>(rng() % 8);
    const int window = static_cast<int>(rng() % 3) == 0 ? static_cast<int>(rng() % 40) : -1;
    std::vector<std::int32_t> table(static_cast<std::size_t>(batch) * width), lens(batch);
    std::int32_t next_id = 0;
    for (int b = 0; b < batch; ++b) {
      // A prefix of an earlier row's blocks (a fork), then fresh blocks.
      const int from = b > 0 ? static_cast<int>(rng() % b) : 0;
      const int shared = b > 0 ? static_cast<int>(rng() % (width + 1)) : 0;
      for (int j = 0; j < width; ++j) {
        table[b * width + j] = j < shared ? table[from * width + j] : next_id++;
      }
      lens[b] = static_cast<std::int32_t>(rng() % (width * bs + 1));
    }
    std::set<std::pair<std::int32_t, int>> seen;
    std::int64_t per_sequence = 0;
    for (int b = 0; b < batch; ++b) {
      const int first = window < 0 ? 0 : std::max(0, lens[b] - 1 - window);
      for (int t = first; t < lens[b]; ++t) {
        seen.insert({table[b * width + t / bs], t % bs});
        ++per_sequence;
      }
    }
    const SharedBlockReads r =
        count_shared_reads(table.data(), width, lens.data(), batch, bs, window);
    EXPECT_EQ(r.per_sequence_tokens, per_sequence) << trial;
    EXPECT_EQ(r.distinct_tokens, static_cast<std::int64_t>(seen.size())) << trial;
  }
}

}  // namespace
}  // namespace pagedattn
