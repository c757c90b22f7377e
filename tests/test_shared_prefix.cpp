// Finding shared prefixes (find_shared_prefixes, pagedattn/shared_prefix.hpp): which sequences
// form groups, how many tokens each group shares, and what keeps a sequence out.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "pagedattn/shared_prefix.hpp"
#include "pagedattn/tree_mask.hpp"

namespace pagedattn {
namespace {

// Tables of `rows` (each padded to `width` with -1), lengths and, optionally, query counts, over a
// bf16 cache of 8 heads, 2 kv heads, head dim 64 and blocks of `bs`.
struct Tables {
  int bs = 16, width = 0;
  std::vector<std::int32_t> table, lens, indptr;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> mask_indptr;

  Tables(int block_size, std::vector<std::vector<std::int32_t>> rows, std::vector<int> lengths)
      : bs(block_size) {
    for (const auto& r : rows) width = std::max<int>(width, static_cast<int>(r.size()));
    for (const auto& r : rows) {
      table.insert(table.end(), r.begin(), r.end());
      table.insert(table.end(), width - r.size(), -1);
    }
    lens.assign(lengths.begin(), lengths.end());
  }
  void query_counts(const std::vector<int>& n) {
    indptr.assign(1, 0);
    for (int c : n) indptr.push_back(indptr.back() + c);
  }
  DecodeArgs args() const {
    DecodeArgs a;
    a.batch = static_cast<int>(lens.size());
    a.num_heads = 8;
    a.num_kv_heads = 2;
    a.head_dim = 64;
    a.block_size = bs;
    a.num_blocks = 1 << 20;
    a.max_blocks_per_seq = width;
    a.k_dtype = a.v_dtype = DType::kBF16;
    a.block_table = table.data();
    a.context_lens = lens.data();
    if (!indptr.empty()) {
      a.q_indptr = indptr.data();
      a.num_q_tokens = indptr.back();
      a.max_q_len = 8;
    }
    if (!mask.empty()) {
      a.tree_mask = mask.data();
      a.tree_mask_indptr = mask_indptr.data();
    }
    return a;
  }
};

// Rows of `blocks` ids: the first `shared` of them `base`, base + 1, ..., the rest unique to row r.
std::vector<std::int32_t> row(int blocks, int shared, int base, int r) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < blocks; ++i) ids.push_back(i < shared ? base + i : 100000 * (r + 1) + i);
  return ids;
}

TEST(SharedPrefixDetect, NoSharing) {
  const Tables t(16, {row(10, 0, 0, 0), row(10, 0, 0, 1), row(10, 0, 0, 2)}, {160, 150, 140});
  const SharedPrefixes s = find_shared_prefixes(t.args());
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.shared_tokens, std::vector<std::int32_t>({0, 0, 0}));
  EXPECT_EQ(s.saved_tokens(), 0);
}

TEST(SharedPrefixDetect, AllSharingEndsWhereTheTablesPart) {
  // Four samples of one prompt of 8 blocks, each with blocks of its own after it.
  const Tables t(16, {row(10, 8, 7, 0), row(10, 8, 7, 1), row(11, 8, 7, 2), row(9, 8, 7, 3)},
                 {160, 151, 170, 140});
  const SharedPrefixes s = find_shared_prefixes(t.args());
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].count, 4);
  EXPECT_EQ(s.groups[0].tokens, 8 * 16);
  EXPECT_EQ(s.members, std::vector<std::int32_t>({0, 1, 2, 3}));
  EXPECT_EQ(s.shared_tokens, std::vector<std::int32_t>({128, 128, 128, 128}));
  EXPECT_EQ(s.saved_tokens(), 3 * 128);
}

TEST(SharedPrefixDetect, WholeTablesSharedEndMidBlockAtTheShortestContext) {
  // Identical tables: the shared tokens stop at what every member attends, inside a block.
  const Tables t(16, {row(6, 6, 0, 0), row(6, 6, 0, 1), row(6, 6, 0, 2)}, {90, 85, 96});
  const SharedPrefixes s = find_shared_prefixes(t.args());
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].tokens, 85);
}

TEST(SharedPrefixDetect, EntriesPastTheContextAreNeverCompared) {
  // The contexts end in block 3; sequence 1's entries after it hold -1 and garbage, which must
  // neither join nor split the group.
  Tables t(16, {row(8, 8, 0, 0), row(8, 8, 0, 1), row(8, 8, 0, 2)}, {60, 60, 60});
  const int w = t.width;
  t.table[w + 4] = -1;
  t.table[w + 5] = std::numeric_limits<std::int32_t>::max();
  t.table[w + 6] = -123456;
  const SharedPrefixes s = find_shared_prefixes(t.args());
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].count, 3);
  EXPECT_EQ(s.groups[0].tokens, 60);
}

TEST(SharedPrefixDetect, ContextsOfZeroAndOneTokenShareNothing) {
  const Tables t(16, {row(2, 2, 0, 0), row(2, 2, 0, 1), row(2, 2, 0, 2)}, {0, 1, 1});
  const DecodeArgs a = t.args();
  EXPECT_EQ(common_prefix_tokens(a, 0), 0);
  EXPECT_EQ(common_prefix_tokens(a, 1), 1);
  // One token read once instead of twice saves less than the states it adds.
  EXPECT_TRUE(find_shared_prefixes(a).empty());
}

TEST(SharedPrefixDetect, TheThresholdIsTheBytesSavedAgainstTheStatesAdded) {
  const Tables t(16, {row(4, 4, 0, 0)}, {64});
  const DecodeArgs a = t.args();
  // bf16, head dim 64: a shared token saves 256 bytes per member past the first; a query row's
  // state costs 8 x 66 = 528 bytes. Two members of group 4 (8 rows): 4224 bytes, 17 tokens.
  EXPECT_FALSE(shared_prefix_pays(a, 2, 8, 16));
  EXPECT_TRUE(shared_prefix_pays(a, 2, 8, 17));
  EXPECT_FALSE(shared_prefix_pays(a, 1, 4, 1000));
  // Eight members (32 rows): 16896 bytes against 7 x 256 a token, 10 tokens.
  EXPECT_FALSE(shared_prefix_pays(a, 8, 32, 9));
  EXPECT_TRUE(shared_prefix_pays(a, 8, 32, 10));
}

TEST(SharedPrefixDetect, NestedForksKeepTheCutThatSavesMost) {
  // Eight samples share 2 blocks; pairs of them share 20 more: the pairs save more.
  std::vector<std::vector<std::int32_t>> rows;
  for (int r = 0; r < 8; ++r) {
    std::vector<std::int32_t> ids = row(2, 2, 0, r);
    for (int i = 0; i < 20; ++i) ids.push_back(1000 + 100 * (r / 2) + i);
    ids.push_back(500000 + r);
    rows.push_back(ids);
  }
  const Tables pairs(16, rows, std::vector<int>(8, 23 * 16));
  SharedPrefixes s = find_shared_prefixes(pairs.args());
  ASSERT_EQ(s.groups.size(), 4u);
  for (const SharedPrefixGroup& g : s.groups) {
    EXPECT_EQ(g.count, 2);
    EXPECT_EQ(g.tokens, 22 * 16);
  }
  EXPECT_EQ(s.members, std::vector<std::int32_t>({0, 1, 2, 3, 4, 5, 6, 7}));

  // Eight samples share 20 blocks; pairs share 1 more: the eight as one group save more.
  rows.clear();
  for (int r = 0; r < 8; ++r) {
    std::vector<std::int32_t> ids = row(20, 20, 0, r);
    ids.push_back(1000 + r / 2);
    ids.push_back(500000 + r);
    rows.push_back(ids);
  }
  const Tables eight(16, rows, std::vector<int>(8, 22 * 16));
  s = find_shared_prefixes(eight.args());
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].count, 8);
  EXPECT_EQ(s.groups[0].tokens, 20 * 16);
}

TEST(SharedPrefixDetect, PartialSharingBatches) {
  // Two prompts' samples interleaved with unrelated sequences; groups list their members in
  // order, groups ordered by their first member.
  const Tables t(16,
                 {row(12, 10, 50, 0), row(12, 0, 0, 1), row(12, 10, 80, 2), row(12, 10, 50, 3),
                  row(12, 10, 80, 4), row(12, 0, 0, 5), row(12, 10, 50, 6)},
                 std::vector<int>(7, 180));
  const SharedPrefixes s = find_shared_prefixes(t.args());
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].count, 3);
  EXPECT_EQ(s.groups[1].count, 2);
  EXPECT_EQ(s.members, std::vector<std::int32_t>({0, 3, 6, 2, 4}));
  EXPECT_EQ(s.shared_tokens, std::vector<std::int32_t>({160, 0, 160, 160, 160, 0, 160}));
}

TEST(SharedPrefixDetect, SeveralQueryTokensShareUpToTheFirstOnesPosition) {
  // Token i of n sits at L - n + i: every row attends the first L - n + 1 tokens.
  Tables t(16, {row(8, 8, 0, 0), row(8, 8, 0, 1), row(8, 8, 0, 2)}, {128, 128, 128});
  t.query_counts({4, 1, 2});
  const DecodeArgs a = t.args();
  EXPECT_EQ(common_prefix_tokens(a, 0), 125);
  EXPECT_EQ(common_prefix_tokens(a, 1), 128);
  EXPECT_EQ(common_prefix_tokens(a, 2), 127);
  const SharedPrefixes s = find_shared_prefixes(a);
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].tokens, 125);

  // No query token: nothing to share; more query tokens than the context: nothing either.
  t.query_counts({0, 2, 3});
  t.lens = {128, 1, 128};
  const DecodeArgs b = t.args();
  EXPECT_EQ(common_prefix_tokens(b, 0), 0);
  EXPECT_EQ(common_prefix_tokens(b, 1), 0);
  EXPECT_EQ(common_prefix_tokens(b, 2), 126);
}

TEST(SharedPrefixDetect, TreeMaskRowsThatDropTheFirstNewTokenStopBeforeIt) {
  Tables t(16, {row(8, 8, 0, 0), row(8, 8, 0, 1)}, {128, 128});
  t.query_counts({3, 3});
  // Sequence 0: a chain (every row keeps new token 0); sequence 1: token 2 a root of its own.
  t.mask.assign(4, 0);
  t.mask_indptr = {0, 2, 4};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j <= i; ++j) set_tree_mask_bit(t.mask.data(), i * 3 + j);
    if (i != 2) set_tree_mask_bit(t.mask.data() + 2, i * 3 + 0);
    if (i >= 1) set_tree_mask_bit(t.mask.data() + 2, i * 3 + i);
  }
  set_tree_mask_bit(t.mask.data() + 2, 2 * 3 + 2);
  const DecodeArgs a = t.args();
  EXPECT_EQ(common_prefix_tokens(a, 0), 126);
  EXPECT_EQ(common_prefix_tokens(a, 1), 125);
  EXPECT_EQ(find_shared_prefixes(a).groups.at(0).tokens, 125);
}

TEST(SharedPrefixDetect, WindowsThatDoNotReachTokenZeroShareNothing) {
  Tables t(16, {row(8, 8, 0, 0), row(8, 8, 0, 1), row(8, 8, 0, 2)}, {128, 100, 120});
  DecodeArgs a = t.args();
  a.window_left = 119;  // the last query token of 120 tokens attends from 0; of 128, from 8
  EXPECT_EQ(common_prefix_tokens(a, 0), 0);
  EXPECT_EQ(common_prefix_tokens(a, 1), 100);
  EXPECT_EQ(common_prefix_tokens(a, 2), 120);
  const SharedPrefixes s = find_shared_prefixes(a);
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.members, std::vector<std::int32_t>({1, 2}));
  EXPECT_EQ(s.groups[0].tokens, 100);
  a.window_left = 50;
  EXPECT_TRUE(find_shared_prefixes(a).empty());
}

}  // namespace
}  // namespace pagedattn
