#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "draw_parts.hpp"

namespace pagedattn::fuzz {
namespace {

// One sequence's query tokens: mostly 1-8, sometimes 0 (a sequence with nothing to decode this
// step) or 9-16, occasionally up to 40.
int draw_query_count(Rng& r) {
  const double u = r.real();
  if (u < 0.08) return 0;
  if (u < 0.45) return r.uniform(1, 4);
  if (u < 0.72) return r.uniform(5, 8);
  if (u < 0.94) return r.uniform(9, 16);
  return r.uniform(17, 40);
}

// What a multi-token case costs, in tokens (times kv heads and head_dim): each sequence's context
// in the pool, and every query token's context in the reference and the backend, each query
// token a query of its own context.
std::int64_t query_work(const testing::CaseSpec& s, const std::vector<int>& q_lens) {
  std::int64_t work = 0;
  for (int b = 0; b < s.batch; ++b) {
    const std::int64_t n = q_lens[static_cast<std::size_t>(b)];
    const std::int64_t L = std::max(s.context_lens[static_cast<std::size_t>(b)], 0);
    work += L;
    // The query tokens' contexts, L - n + 1 .. L, those below 1 attending to nothing.
    const std::int64_t lo = std::max<std::int64_t>(L - n + 1, 1);
    if (lo <= L) work += (lo + L) * (L - lo + 1) / 2;
  }
  return work;
}

// A random tree (a forest) over n tokens: each token's parent a random earlier token or none
// (roots more or less often, and now and then a chain: every parent the token before, which is
// the causal rule); a token attends itself and its ancestors.
std::string draw_tree(Rng& r, int n) {
  static const double kRootChance[] = {0.0, 0.1, 0.3, 0.7};
  const double root = r.pick(kRootChance);
  const double chain = r.chance(0.2) ? 1.0 : r.real() * 0.5;
  std::vector<int> parent(static_cast<std::size_t>(n), -1);
  std::string mask(static_cast<std::size_t>(n) * n, '0');
  for (int i = 0; i < n; ++i) {
    if (i > 0 && !r.chance(root)) parent[i] = r.chance(chain) ? i - 1 : r.uniform(0, i - 1);
    for (int a = i; a >= 0; a = parent[a]) mask[static_cast<std::size_t>(i) * n + a] = '1';
  }
  return mask;
}

// Any lower-triangular pattern: bits below the diagonal at a drawn density (none and all
// included), the diagonal all set, all clear or random (a token that does not attend itself).
std::string draw_lower_triangle(Rng& r, int n) {
  static const double kDensity[] = {0.0, 0.1, 0.5, 0.9, 1.0};
  const double density = r.chance(0.8) ? r.pick(kDensity) : r.real();
  const int diagonal = r.uniform(0, 2);  // 0: set, 1: clear, 2: random
  std::string mask(static_cast<std::size_t>(n) * n, '0');
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      const bool bit =
          j < i ? r.chance(density) : diagonal == 0 || (diagonal == 2 && r.chance(0.5));
      mask[static_cast<std::size_t>(i) * n + j] = bit ? '1' : '0';
    }
  }
  return mask;
}

}  // namespace

// Tree masks for 30% of the multi-token cases (every one when `force`): per sequence a random tree
// (70%) or any lower-triangular pattern, and in 70% of them packed with padding (FuzzCase::
// tree_pack_seed).
void draw_tree_masks(FuzzCase& c, Rng& r, bool force) {
  if (!c.multi_token() || (!force && !r.chance(0.3))) return;
  c.tree = true;
  c.tree_masks.clear();
  for (int n : c.q_lens) {
    c.tree_masks.push_back(r.chance(0.7) ? draw_tree(r, n) : draw_lower_triangle(r, n));
  }
  c.tree_pack_seed = r.chance(0.7) ? r.next() | 1 : 0;
}

// Multi-token queries for a quarter of the cases (speculative decoding's drafts, chunked
// prefill): per-sequence counts, one for every sequence in a third of them (a fixed draft
// length), and a max_q_len at or a little above the largest. The drawn context is mostly the
// context before the new tokens, which are appended to it (their keys and values are in the cache
// when decode runs), else kept as drawn, then shorter than the count now and then (queries at
// positions below 0, which attend to nothing); a few sequences get every token new, or more. The
// rows stay within the q/out bound and the work (query_work) within `work_budget` elements, by
// halving the longest context (down to its count) or the largest count. From a generator of its
// own, and before the variants, so a window is drawn against the final contexts.
void draw_query_lens(FuzzCase& c, Rng& r, std::int64_t work_budget, bool force) {
  if (!force && !r.chance(0.25)) return;
  testing::CaseSpec& s = c.spec;
  c.q_lens.assign(static_cast<std::size_t>(std::max(s.batch, 0)), 0);
  const bool same = r.chance(0.3);
  const int fixed = std::max(draw_query_count(r), 1);
  for (int b = 0; b < s.batch; ++b) {
    int& n = c.q_lens[static_cast<std::size_t>(b)];
    int& L = s.context_lens[static_cast<std::size_t>(b)];
    n = same ? fixed : draw_query_count(r);
    const double u = r.real();
    if (u < 0.6 || (u < 0.85 && L < n)) {
      L += n;  // the drawn context precedes the new tokens
    } else if (u >= 0.85 && u < 0.9 && L <= 40) {
      n = L + r.uniform(0, 3);  // every token new, or queries before the context
    }
  }
  const std::int64_t row = static_cast<std::int64_t>(s.num_heads) * s.head_dim;
  const std::int64_t per_token = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  for (;;) {
    const std::int64_t rows = std::accumulate(c.q_lens.begin(), c.q_lens.end(), std::int64_t{0});
    const bool rows_over = rows * row > (std::int64_t{1} << 18);
    if (!rows_over && query_work(s, c.q_lens) * per_token <= work_budget) break;
    // The sequence with the most work (the most rows when the rows are over).
    int worst = -1;
    std::int64_t most = -1;
    for (int b = 0; b < s.batch; ++b) {
      const std::int64_t n = c.q_lens[static_cast<std::size_t>(b)];
      const std::int64_t L = std::max(s.context_lens[static_cast<std::size_t>(b)], 0);
      const std::int64_t w = rows_over ? n : (n + 1) * L + n;
      if (w > most) most = w, worst = b;
    }
    if (worst < 0) break;
    int& n = c.q_lens[static_cast<std::size_t>(worst)];
    int& L = s.context_lens[static_cast<std::size_t>(worst)];
    if (!rows_over && L > 4 * n) {
      L = std::max(L / 2, n);
    } else if (n > 1) {
      n /= 2;
    } else if (!rows_over && L > 0) {
      L /= 2;
    } else {
      break;  // nothing left to trim
    }
  }
  const int longest = c.q_lens.empty() ? 0 : *std::max_element(c.q_lens.begin(), c.q_lens.end());
  c.max_q_len = std::max(longest, 1);
  if (r.chance(0.3)) c.max_q_len += r.chance(0.9) ? r.uniform(1, 8) : r.uniform(9, 64);
}

}  // namespace pagedattn::fuzz
