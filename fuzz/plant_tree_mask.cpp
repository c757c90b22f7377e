// The tree-mask malformations (plant_malformation.hpp).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/tree_mask.hpp"
#include "plant_malformation.hpp"

namespace pagedattn::fuzz {
namespace {

// The sequences with at least `n` query tokens (their index), or not_applicable.
std::vector<int> sequences_with_queries(const FuzzCase& c, int n) {
  std::vector<int> found;
  for (int s = 0; s < c.spec.batch; ++s) {
    if (c.q_lens[static_cast<std::size_t>(s)] >= n) found.push_back(s);
  }
  if (found.empty()) not_applicable(c);
  return found;
}

}  // namespace

// A tree mask the API refuses: a bit above the diagonal, a span too short for its mask, a
// negative first offset, one of its two pointers alone, or a mask without q_indptr. validate_
// tree_mask checks the sequences in order, each one's span before its bits, so the error names
// the sequence planted in (every other sequence keeps its valid mask).
void plant_in_tree_mask(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  if (!c.tree || c.spec.batch <= 0) not_applicable(c);
  std::vector<std::int32_t>& indptr = b.tree_mask_indptr;
  switch (c.bad) {
    case Malformation::kTreeBitAboveDiagonal: {
      const std::vector<int> seqs = sequences_with_queries(c, 2);
      const int s = seqs[p % seqs.size()];
      const int n = c.q_lens[static_cast<std::size_t>(s)];
      const int i = static_cast<int>((p >> 8) % static_cast<std::uint64_t>(n - 1));
      const int j = i + 1 + static_cast<int>((p >> 24) % static_cast<std::uint64_t>(n - 1 - i));
      const std::int64_t bit =
          static_cast<std::int64_t>(indptr[s]) * 8 + static_cast<std::int64_t>(i) * n + j;
      set_tree_mask_bit(b.tree_mask.data(), bit);
      b.expected_argument = "tree_mask bit (" + std::to_string(i) + ", " + std::to_string(j) +
                            ") of sequence " + std::to_string(s);
      break;
    }
    case Malformation::kTreeSpanShort: {
      // One byte short, empty, or negative (down to INT32_MIN): tree_mask_indptr[s + 1] below
      // tree_mask_indptr[s] + ceil(n^2 / 8).
      const std::vector<int> seqs = sequences_with_queries(c, 1);
      const int s = seqs[p % seqs.size()];
      const std::int64_t start = indptr[s];
      const std::int64_t values[] = {start + tree_mask_bytes(c.q_lens[s]) - 1, start,
                                     start - 1 - static_cast<std::int64_t>((p >> 16) % 100),
                                     INT32_MIN};
      indptr[s + 1] = static_cast<std::int32_t>(std::max<std::int64_t>(
          values[(p >> 8) % (sizeof(values) / sizeof(values[0]))], INT32_MIN));
      b.expected_argument = "tree_mask_indptr[" + std::to_string(s + 1) + "]";
      break;
    }
    case Malformation::kTreeIndptrStart: {
      const std::int32_t values[] = {-1, -8, -1 - static_cast<std::int32_t>((p >> 16) % 1000),
                                     INT32_MIN};
      indptr[0] = values[(p >> 8) % 4];
      b.expected_argument = "tree_mask_indptr[0]";
      break;
    }
    case Malformation::kTreeUnpaired:
      // The error names the pointer that is missing.
      if (p % 2) {
        a.tree_mask = nullptr;
        b.expected_argument = "tree_mask";
      } else {
        a.tree_mask_indptr = nullptr;
        b.expected_argument = "tree_mask_indptr";
      }
      break;
    case Malformation::kTreeWithoutQIndptr:
      // One query token per sequence as far as the counts go: only the tree mask is wrong.
      a.q_indptr = nullptr;
      a.num_q_tokens = 0;
      a.max_q_len = 0;
      b.expected_argument = "q_indptr";
      break;
    default:
      break;
  }
}

}  // namespace pagedattn::fuzz
