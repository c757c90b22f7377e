// Block manager: slot arithmetic, fork and copy-on-write, and invariants over random operation
// sequences (no block owned twice, reference counts exact, every block free at the end, running
// out of blocks changes nothing). PAGEDATTN_TEST_SEED replays one seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/block_manager.hpp"

namespace pagedattn {
namespace {

using SeqId = BlockManager::SeqId;

TEST(BlockManager, PromptSlotsFollowTheBlocks) {
  BlockManager bm(8, 4);
  const std::vector<std::int32_t> slots = bm.add_sequence(7, 6);
  ASSERT_EQ(slots.size(), 6u);
  const auto& blocks = bm.blocks(7);
  ASSERT_EQ(blocks.size(), 2u);
  for (int t = 0; t < 6; ++t) EXPECT_EQ(slots[t], blocks[t / 4] * 4 + t % 4) << t;
  EXPECT_EQ(bm.num_free_blocks(), 6);
  const BlockManager::Append a = bm.append_token(7);
  EXPECT_EQ(a.slot, blocks[1] * 4 + 2);
  EXPECT_FALSE(a.copy);
  EXPECT_EQ(bm.length(7), 7);
  bm.append_token(7);
  const BlockManager::Append c = bm.append_token(7);  // token 8 starts a third block
  EXPECT_EQ(bm.blocks(7).size(), 3u);
  EXPECT_EQ(c.slot, bm.blocks(7)[2] * 4);
  const BlockManager::Tables t = bm.tables({7}, 5);
  EXPECT_EQ(t.max_blocks_per_seq, 5);
  EXPECT_EQ(t.context_lens, std::vector<std::int32_t>{9});
  EXPECT_EQ(t.block_table[3], -1);
  EXPECT_EQ(t.block_table[4], -1);
  bm.free_sequence(7);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  bm.check_invariants();
}

TEST(BlockManager, ForkSharesBlocksAndCopiesThePartialBlockOnWrite) {
  BlockManager bm(8, 4);
  bm.add_sequence(1, 6);  // blocks [a, b], b holds 2 tokens
  bm.fork(1, 2);
  const std::vector<std::int32_t> shared = bm.blocks(1);
  EXPECT_EQ(bm.blocks(2), shared);
  EXPECT_EQ(bm.ref_count(shared[0]), 2);
  EXPECT_EQ(bm.ref_count(shared[1]), 2);
  EXPECT_EQ(bm.num_free_blocks(), 6);  // a fork allocates nothing
  EXPECT_EQ(bm.blocks_to_append(2), 1);

  const BlockManager::Append a = bm.append_token(2);  // the child writes first: it copies
  ASSERT_TRUE(a.copy);
  EXPECT_EQ(a.copy->src, shared[1]);
  EXPECT_EQ(a.copy->dst, bm.blocks(2)[1]);
  EXPECT_EQ(a.slot, bm.blocks(2)[1] * 4 + 2);
  EXPECT_EQ(bm.blocks(2)[0], shared[0]);  // the full block stays shared
  EXPECT_EQ(bm.ref_count(shared[1]), 1);

  const BlockManager::Append p = bm.append_token(1);  // the parent owns b alone now
  EXPECT_FALSE(p.copy);
  EXPECT_EQ(p.slot, shared[1] * 4 + 2);
  bm.check_invariants();
  bm.free_sequence(1);
  EXPECT_EQ(bm.ref_count(shared[0]), 1);
  bm.free_sequence(2);
  EXPECT_EQ(bm.num_free_blocks(), 8);
}

TEST(BlockManager, ForkAtABlockBoundaryNeedsNoCopy) {
  BlockManager bm(4, 4);
  bm.add_sequence(1, 8);
  bm.fork(1, 2);
  const BlockManager::Append a = bm.append_token(2);
  EXPECT_FALSE(a.copy);
  EXPECT_EQ(bm.blocks(2).size(), 3u);
  EXPECT_EQ(bm.ref_count(bm.blocks(2)[2]), 1);
  bm.check_invariants();
}

TEST(BlockManager, ErrorsNameTheArgument) {
  BlockManager bm(2, 16);
  bm.add_sequence(1, 3);
  try {
    bm.add_sequence(1, 3);
    FAIL() << "duplicate id accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "seq");
  }
  try {
    bm.append_token(99);
    FAIL() << "unknown id accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "seq");
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
  try {
    bm.add_sequence(2, 33);  // 3 blocks, 1 free
    FAIL() << "over-allocation accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("out of cache blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BlockManager(4, 0), Error);
  EXPECT_THROW(bm.add_sequence(3, -1), Error);
}

// Negative counts are errors naming the argument, and change nothing.
TEST(BlockManager, NegativeCountsAreErrors) {
  const auto expect_error = [](const std::function<void()>& call, const std::string& argument,
                               const std::string& value) {
    try {
      call();
      ADD_FAILURE() << "a negative " << argument << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_EQ(e.argument(), argument) << e.what();
      EXPECT_NE(std::string(e.what()).find(argument + " = " + value), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("must not be negative"), std::string::npos) << e.what();
    }
  };
  BlockManager bm(8, 4);
  bm.add_sequence(1, 5);
  const auto blocks = bm.blocks(1);
  const int free_blocks = bm.num_free_blocks();
  for (const int n : {-1, -5, -4, std::numeric_limits<int>::min()}) {
    SCOPED_TRACE(n);
    expect_error([&] { (void)bm.blocks_for_prompt(n); }, "prompt_len", std::to_string(n));
    expect_error([&] { bm.add_sequence(2, n); }, "prompt_len", std::to_string(n));
    expect_error([&] { (void)bm.tables({1}, n); }, "min_width", std::to_string(n));
    expect_error([&] { BlockManager(n, 4); }, "num_blocks", std::to_string(n));
  }
  EXPECT_EQ(bm.blocks(1), blocks);
  EXPECT_EQ(bm.num_free_blocks(), free_blocks);
  EXPECT_FALSE(bm.contains(2));
  EXPECT_EQ(bm.blocks_for_prompt(0), 0);
  EXPECT_EQ(bm.blocks_for_prompt(4), 1);
  EXPECT_EQ(bm.blocks_for_prompt(5), 2);
  EXPECT_EQ(bm.tables({1}, 0).max_blocks_per_seq, 2);
}

// Everything observable about the manager, to compare before and after a failed operation.
struct Snapshot {
  std::map<SeqId, std::pair<std::vector<std::int32_t>, int>> seqs;
  std::vector<int> refs;
  int free_blocks = 0;
  bool operator==(const Snapshot& o) const {
    return seqs == o.seqs && refs == o.refs && free_blocks == o.free_blocks;
  }
};

Snapshot snapshot(const BlockManager& bm) {
  Snapshot s;
  for (const SeqId id : bm.sequences()) s.seqs[id] = {bm.blocks(id), bm.length(id)};
  for (int b = 0; b < bm.num_blocks(); ++b) s.refs.push_back(bm.ref_count(b));
  s.free_blocks = bm.num_free_blocks();
  return s;
}

// The invariants, recomputed from the public view only.
void expect_consistent(const BlockManager& bm) {
  std::vector<int> refs(bm.num_blocks(), 0);
  for (const SeqId id : bm.sequences()) {
    const auto& blocks = bm.blocks(id);
    ASSERT_EQ(static_cast<int>(blocks.size()),
              (bm.length(id) + bm.block_size() - 1) / bm.block_size())
        << "seq " << id;
    for (const std::int32_t b : blocks) {
      ASSERT_GE(b, 0);
      ASSERT_LT(b, bm.num_blocks());
      ++refs[b];
    }
  }
  int used = 0;
  for (int b = 0; b < bm.num_blocks(); ++b) {
    ASSERT_EQ(refs[b], bm.ref_count(b)) << "block " << b;
    used += refs[b] > 0;
  }
  ASSERT_EQ(used + bm.num_free_blocks(), bm.num_blocks());
  ASSERT_NO_THROW(bm.check_invariants());
}

std::uint64_t base_seed() {
  const char* env = std::getenv("PAGEDATTN_TEST_SEED");
  return env ? std::strtoull(env, nullptr, 10) : 20260;
}

TEST(BlockManager, RandomOperationsKeepTheInvariants) {
  const std::uint64_t first = base_seed();
  for (std::uint64_t seed = first; seed < first + 40; ++seed) {
    SCOPED_TRACE("PAGEDATTN_TEST_SEED=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int block_size = std::vector<int>{1, 3, 4, 16}[seed % 4];
    BlockManager bm(static_cast<int>(24 + rng() % 40), block_size);
    SeqId next = 0;
    int failures = 0;
    for (int op = 0; op < 600; ++op) {
      const std::vector<SeqId> live = bm.sequences();
      const int kind = live.empty() ? 0 : static_cast<int>(rng() % 10);
      const Snapshot before = snapshot(bm);
      try {
        if (kind == 0) {  // add
          const int prompt = static_cast<int>(rng() % (4 * block_size + 3));
          const std::vector<std::int32_t> slots = bm.add_sequence(next, prompt);
          ASSERT_EQ(static_cast<int>(slots.size()), prompt);
          for (const std::int32_t s : slots) ASSERT_EQ(bm.ref_count(s / block_size), 1);
          ++next;
        } else {
          const SeqId id = live[rng() % live.size()];
          if (kind <= 6) {  // append
            const int need = bm.blocks_to_append(id);
            const int free_before = bm.num_free_blocks();
            const BlockManager::Append a = bm.append_token(id);
            // The written block belongs to this sequence alone.
            ASSERT_EQ(bm.ref_count(a.slot / block_size), 1);
            ASSERT_EQ(a.slot, bm.slot(id, bm.length(id) - 1));
            ASSERT_EQ(free_before - bm.num_free_blocks(), need);
            if (a.copy) ASSERT_EQ(a.copy->dst, a.slot / block_size);
          } else if (kind == 7) {  // fork
            bm.fork(id, next++);
          } else {
            bm.free_sequence(id);
          }
        }
      } catch (const Error& e) {
        // Only running out of blocks may fail here, and it must change nothing.
        ASSERT_EQ(e.code(), ErrorCode::kOutOfRange) << e.what();
        ASSERT_TRUE(snapshot(bm) == before) << "state changed by a failed operation";
        ++failures;
        // Make room: free the oldest sequence.
        if (!live.empty()) bm.free_sequence(live.front());
      }
      expect_consistent(bm);
      if (HasFatalFailure()) return;
    }
    for (const SeqId id : bm.sequences()) bm.free_sequence(id);
    EXPECT_EQ(bm.num_free_blocks(), bm.num_blocks());
    EXPECT_EQ(bm.num_used_blocks(), 0);
    EXPECT_EQ(bm.fragmentation(), 0.0);
    bm.check_invariants();
    (void)failures;
  }
}

TEST(BlockManager, FragmentationCountsEmptySlotsOfUsedBlocks) {
  BlockManager bm(8, 4);
  bm.add_sequence(1, 5);  // 2 blocks, 5 of 8 slots
  EXPECT_DOUBLE_EQ(bm.fragmentation(), 3.0 / 8.0);
  bm.fork(1, 2);  // shares everything: nothing new stored
  EXPECT_DOUBLE_EQ(bm.fragmentation(), 3.0 / 8.0);
  bm.append_token(2);  // copies block 2: 3 blocks, 5 + 2 stored
  EXPECT_EQ(bm.stored_tokens(), 7);
  EXPECT_DOUBLE_EQ(bm.fragmentation(), 1.0 - 7.0 / 12.0);
}

}  // namespace
}  // namespace pagedattn
