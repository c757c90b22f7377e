// How the context-parallel tests and the fuzzer share out the blocks of a random case among ranks:
// for every sequence, each rank's block table row lists the blocks it holds in context order and
// its context length counts their tokens (a sequence's last, partial block goes to the rank that
// holds it, as the last entry of its row).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::testing {

// Ranges: each sequence cut at random points into contiguous ranges (uneven, some empty).
// Strides: block i to rank i % ranks.
enum class Share { kRanges, kStrides };

// Rank r's block table and lengths: the blocks of every sequence it holds, in context order.
struct RankShare {
  std::vector<std::int32_t> table, lens;
};

inline std::vector<RankShare> share_out(const HostCase& c, int ranks, Share how,
                                        std::mt19937& rng) {
  const int B = c.spec.batch, BS = c.spec.block_size;
  std::vector<RankShare> out(ranks);
  for (RankShare& s : out) {
    s.table.assign(c.block_table.size(), -1);
    s.lens.assign(B, 0);
  }
  for (int b = 0; b < B; ++b) {
    const int len = c.context_lens[b];
    const int nb = (len + BS - 1) / BS;
    std::vector<int> owner(nb);
    if (how == Share::kStrides) {
      for (int i = 0; i < nb; ++i) owner[i] = i % ranks;
    } else {  // ranges at random cut points: uneven, some empty
      std::vector<int> cuts(ranks - 1);
      for (int& x : cuts) x = std::uniform_int_distribution<int>(0, nb)(rng);
      std::sort(cuts.begin(), cuts.end());
      for (int i = 0; i < nb; ++i) {
        owner[i] = static_cast<int>(std::upper_bound(cuts.begin(), cuts.end(), i) - cuts.begin());
      }
    }
    for (int i = 0; i < nb; ++i) {
      RankShare& s = out[owner[i]];
      const int slot = s.lens[b] / BS;  // holders get whole blocks, the last one its remainder
      s.table[static_cast<std::size_t>(b) * c.table_stride + slot] =
          c.block_table[static_cast<std::size_t>(b) * c.table_stride + i];
      s.lens[b] += std::min(BS, len - i * BS);
    }
  }
  return out;
}

}  // namespace pagedattn::testing
