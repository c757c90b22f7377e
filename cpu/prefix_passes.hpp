// Shared prefixes on the CPU backend (DecodeOptions::share_prefixes): the groups of a call
// (find_shared_prefixes) as passes of the ordinary item kernel. A group's members' query rows
// become the rows of one sequence of a pass, all of them attending the group's shared tokens, so
// each shared K/V row is read once per group; decode_cpu.cpp runs the passes beside the members'
// own tokens and merges each row's two states.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/split_plan.hpp"

namespace pagedattn::detail::cpu {

// The most query rows of one kv head that one pass sequence takes: a larger group is cut into
// chunks of members, each reading the shared blocks once. 128 rows' accumulators of one kv head
// are 64 KB at head dim 128, what a core's L2 keeps beside the blocks it streams.
constexpr int kMaxPrefixRows = 128;

// One pass: the chunks whose members bring the same number Q of query tokens. Its view is a call
// of `chunks` sequences of Q x num_heads query heads (Q x G rows per kv head: member after member,
// each member's query tokens in order, each token's G heads), each over its chunk's shared tokens
// of its first member's table row, with no window, causal rule, tree mask or sink (every row
// attends every shared token; the sink joins once, at the end). ALiBi slopes are the call's per
// row, the bias taken from the shared tokens' last position: a row at position P gets
// slope * (t - P) = slope * (t - (tokens - 1)) + slope * (tokens - 1 - P), the second term a
// constant of the row that the merge adds to its state's max (prefix_alibi_shift).
struct PrefixPass {
  int query_tokens = 0;  // Q
  DecodeArgs view;
  std::vector<std::int32_t> lens;  // shared tokens per chunk
  std::vector<std::int32_t> rows;  // the table row each chunk reads
  std::vector<float> slopes;       // ALiBi per view head (empty without)
  std::vector<float> q;            // [chunk][kv head][Q x G][head_dim], scaled as the kernel takes
  std::vector<bf16_t> words;       // the same rows of a bf16 q, unscaled (empty otherwise)
  SplitPlan plan;
};

// Where a sequence of the call has its shared rows: none (pass < 0), or rows [row0 * G,
// (row0 + n_b) * G) of each kv head of sequence `chunk` of pass `pass`, over `tokens` tokens.
struct PrefixLink {
  int pass = -1;
  int chunk = 0;
  int row0 = 0;
  int tokens = 0;
};

struct PrefixPasses {
  std::vector<PrefixPass> passes;
  std::vector<PrefixLink> links;  // per sequence of the call
  bool empty() const { return passes.empty(); }
};

// The passes of a validated host call's groups (none: an empty result); kept in `out`, whose
// buffers are reused call after call. A call in which no two sequences that may share begin with
// the same block id returns at once, allocating nothing.
void build_prefix_passes(const DecodeArgs& a, PrefixPasses& out);

// What the merge adds to the max of a shared state of query head h for a row at position
// `position` (ALiBi; 0 without): slope_h * (tokens - 1 - position).
inline float prefix_alibi_shift(const DecodeArgs& a, int h, int tokens, int position) {
  return a.alibi_slopes != nullptr ? a.alibi_slopes[h] * static_cast<float>(tokens - 1 - position)
                                   : 0.f;
}

}  // namespace pagedattn::detail::cpu
