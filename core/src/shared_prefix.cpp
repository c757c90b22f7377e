// find_shared_prefixes (shared_prefix.hpp): the sequences sorted by their tables' shareable
// blocks, whose adjacent common prefixes form a tree of candidate groups; a walk of that tree
// keeps, at every node, the node as one group or the best cut of its children, whichever saves
// more.
#include "pagedattn/shared_prefix.hpp"

#include <algorithm>
#include <numeric>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn {
namespace {

int query_tokens(const DecodeArgs& a, int b) {
  return a.q_indptr != nullptr ? a.q_indptr[b + 1] - a.q_indptr[b] : 1;
}

// What one sequence brings to a group: its table row, its shareable tokens and blocks, its query
// rows per kv head.
struct Candidate {
  int seq;
  int tokens;  // common_prefix_tokens
  int blocks;  // the table entries those tokens span
  const std::int32_t* row;
  std::int64_t rows;  // query tokens x group size
};

// Leading table entries two candidates share, among those both may share.
int common_blocks(const Candidate& x, const Candidate& y) {
  const int n = std::min(x.blocks, y.blocks);
  int i = 0;
  while (i < n && x.row[i] == y.row[i]) ++i;
  return i;
}

// Bytes a group of `members` with `rows` query rows per kv head saves by reading `tokens` shared
// tokens once, net of the partial states it adds (shared_prefix.hpp, shared_prefix_pays).
double net_bytes(const DecodeArgs& a, int members, std::int64_t rows, std::int64_t tokens) {
  const double scales =
      a.has_token_scales() ? 8.0 * token_scales_per_row(a.k_dtype, a.head_dim) : 0.0;
  const double token_bytes = 2.0 * static_cast<double>(dtype_bytes(a.k_dtype, a.head_dim)) + scales;
  const double state_bytes = 8.0 * (a.head_dim + 2);
  return (members - 1) * static_cast<double>(tokens) * token_bytes -
         static_cast<double>(rows) * state_bytes;
}

class GroupSearch {
 public:
  GroupSearch(const DecodeArgs& a, std::vector<Candidate> c) : a_(a), c_(std::move(c)) {
    // Lexicographic by the shareable entries: sequences sharing a prefix become neighbours.
    std::sort(c_.begin(), c_.end(), [](const Candidate& x, const Candidate& y) {
      const int n = common_blocks(x, y);
      if (n < x.blocks && n < y.blocks) return x.row[n] < y.row[n];
      if (x.blocks != y.blocks) return x.blocks < y.blocks;
      return x.seq < y.seq;
    });
    lcp_.resize(c_.empty() ? 0 : c_.size() - 1);
    for (std::size_t i = 0; i + 1 < c_.size(); ++i) lcp_[i] = common_blocks(c_[i], c_[i + 1]);
  }

  // The best cut of all candidates. Each group's members ascending and the groups in the order
  // of their first members, so the result does not depend on the block ids.
  SharedPrefixes run() {
    std::vector<Range> chosen;
    best(0, static_cast<int>(c_.size()), chosen);
    std::vector<std::vector<std::int32_t>> members(chosen.size());
    for (std::size_t k = 0; k < chosen.size(); ++k) {
      for (int i = chosen[k].begin; i < chosen[k].end; ++i) members[k].push_back(c_[i].seq);
      std::sort(members[k].begin(), members[k].end());
    }
    std::vector<std::size_t> order(chosen.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t x, std::size_t y) { return members[x][0] < members[y][0]; });
    SharedPrefixes r;
    r.shared_tokens.assign(static_cast<std::size_t>(a_.batch), 0);
    for (std::size_t k : order) {
      const SharedPrefixGroup g{static_cast<int>(r.members.size()),
                                static_cast<int>(members[k].size()), chosen[k].tokens};
      r.groups.push_back(g);
      r.members.insert(r.members.end(), members[k].begin(), members[k].end());
      for (std::int32_t b : members[k]) r.shared_tokens[b] = g.tokens;
    }
    return r;
  }

 private:
  struct Range {
    int begin, end, tokens;
  };

  // The shared tokens of candidates [begin, end) as one group: their common blocks, cut to what
  // every member attends.
  int group_tokens(int begin, int end, int blocks) const {
    std::int64_t tokens = static_cast<std::int64_t>(blocks) * a_.block_size;
    for (int i = begin; i < end; ++i) tokens = std::min<std::int64_t>(tokens, c_[i].tokens);
    return static_cast<int>(tokens);
  }

  // Bytes saved net of the added states by candidates [begin, end) as one group (< 0: it does not
  // pay; shared_prefix_pays is the same test).
  double group_value(int begin, int end, int tokens) const {
    std::int64_t rows = 0;
    for (int i = begin; i < end; ++i) rows += c_[i].rows;
    return net_bytes(a_, end - begin, rows, tokens);
  }

  // The best groups among candidates [begin, end), appended to `out`; returns their value.
  double best(int begin, int end, std::vector<Range>& out) const {
    if (end - begin < 2) return 0;
    int common = lcp_[begin];
    for (int i = begin; i + 1 < end; ++i) common = std::min(common, lcp_[i]);
    // The children: the runs between the places where the common prefix ends (at least two,
    // since some neighbours share no more than `common`).
    std::vector<Range> kids;
    double kids_value = 0;
    for (int i = begin; i < end;) {
      int j = i + 1;
      while (j < end && lcp_[j - 1] > common) ++j;
      kids_value += best(i, j, kids);
      i = j;
    }
    const int tokens = group_tokens(begin, end, common);
    const double whole = tokens > 0 ? group_value(begin, end, tokens) : -1;
    if (whole >= 0 && whole >= kids_value) {
      out.push_back(Range{begin, end, tokens});
      return whole;
    }
    out.insert(out.end(), kids.begin(), kids.end());
    return kids_value;
  }

  const DecodeArgs& a_;
  std::vector<Candidate> c_;
  std::vector<int> lcp_;  // lcp_[i]: common blocks of sorted candidates i and i + 1
};

}  // namespace

std::int64_t SharedPrefixes::saved_tokens() const {
  std::int64_t saved = 0;
  for (const SharedPrefixGroup& g : groups)
    saved += static_cast<std::int64_t>(g.count - 1) * g.tokens;
  return saved;
}

int common_prefix_tokens(const DecodeArgs& a, int b) {
  const int n = query_tokens(a, b);
  const int len = a.context_lens[b];
  if (n <= 0 || len <= 0) return 0;
  if (window_first_token(len, a.window_left) > 0) return 0;
  const int first_query = len - n;  // its first query token's position
  if (first_query < 0) return 0;    // that token attends nothing
  bool all_keep_first = true;       // every row attends the first query token's position
  if (a.tree_mask != nullptr) {
    for (int i = 0; i < n && all_keep_first; ++i) {
      all_keep_first = tree_mask_row(a, b, i).attends(first_query);
    }
  }
  return all_keep_first ? first_query + 1 : first_query;
}

bool shared_prefix_pays(const DecodeArgs& a, int members, std::int64_t query_rows,
                        std::int64_t tokens) {
  return members >= 2 && tokens >= 1 && net_bytes(a, members, query_rows, tokens) >= 0;
}

SharedPrefixes find_shared_prefixes(const DecodeArgs& a) {
  std::vector<Candidate> c;
  const std::int64_t stride = a.table_stride();
  for (int b = 0; b < a.batch; ++b) {
    const int tokens = common_prefix_tokens(a, b);
    if (tokens <= 0) continue;
    c.push_back(Candidate{b, tokens, blocks_for(tokens, a.block_size),
                          a.block_table + static_cast<std::int64_t>(b) * stride,
                          static_cast<std::int64_t>(query_tokens(a, b)) * a.group_size()});
  }
  return GroupSearch(a, std::move(c)).run();
}

}  // namespace pagedattn
