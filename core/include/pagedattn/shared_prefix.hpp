// Shared prefixes (DecodeOptions::share_prefixes): the groups of a call's sequences whose block
// tables begin with the same block ids (BlockManager::fork: n-way sampling, beam search, a shared
// system prompt), and how many leading tokens every query row of every member attends. A backend
// reads those tokens' K and V once for all the group's rows, decodes each member's own tokens
// apart and merges the two partial states (docs/shared_prefix.md).
//
// A pure function of the call's host arrays (block_table, context_lens, q_indptr, tree_mask), the
// reference for any backend that finds the groups itself.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

struct SharedPrefixGroup {
  int first = 0;   // index into SharedPrefixes::members of its first member
  int count = 0;   // members, at least 2
  int tokens = 0;  // shared tokens: positions [0, tokens), at least 1
};

struct SharedPrefixes {
  std::vector<SharedPrefixGroup> groups;
  // The members of every group, group after group, each group's in ascending sequence order.
  std::vector<std::int32_t> members;
  // Per sequence: its group's shared tokens, 0 when it is in none.
  std::vector<std::int32_t> shared_tokens;

  bool empty() const { return groups.empty(); }
  // Tokens whose K/V rows are read once per group instead of once per member, per kv head.
  std::int64_t saved_tokens() const;
};

// The leading tokens that every query row of sequence b attends, and so the most it can share:
//   no query token (q_indptr gives it none), or an empty context: 0;
//   a window (window_left >= 0) that does not reach back to token 0 for its last query token: 0
//   (every earlier row's window starts at 0 as well when the last one's does);
//   otherwise up to its first query token's position P0 = L - n_b: P0 + 1 tokens when every row
//   attends that position (the causal rule; a tree mask whose every row keeps new token 0), else
//   P0 (a tree mask row that drops new token 0).
// Table entries are not read.
int common_prefix_tokens(const DecodeArgs& args, int b);

// The bytes a group saves must pay for the partial states it adds: each member's query rows get
// one more state of head_dim + 2 floats per query head, written by the shared pass and read by
// the merge (8 * (head_dim + 2) bytes), while each shared token is read once instead of once per
// member (its K and V rows of one kv head, with their per-token scales). A group of M members,
// R = sum of its members' query rows per kv head (query tokens x group size) and S shared tokens
// is formed when (M - 1) * S * token_bytes >= R * 8 * (head_dim + 2): with two members of one
// query token at group 4, 17 tokens of a bf16 cache at head dim 128.
bool shared_prefix_pays(const DecodeArgs& args, int members, std::int64_t query_rows,
                        std::int64_t tokens);

// The groups of a validated call (block_table, context_lens, q_indptr and tree_mask in host
// memory). Members of a group hold the same block ids in their first ceil(tokens / block_size)
// table entries; `tokens` is at most every member's common_prefix_tokens, so the last shared block
// may be partly shared (the tokens every member attends). A sequence is in at most one group.
// Among the ways of cutting the sequences into groups along their tables' common prefixes (nested
// forks give nested candidates: 8 samples of one prompt, pairs of them forked again), the one
// that saves the most bytes net of the added states (shared_prefix_pays) wins; groups that do not
// pay are not formed. Entries past what a sequence attends (-1, garbage) are never read.
SharedPrefixes find_shared_prefixes(const DecodeArgs& args);

}  // namespace pagedattn
