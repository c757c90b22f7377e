// Forked tables (draw_parts.hpp): runs of consecutive sequences forked from their first one, as
// BlockManager::fork and copy-on-write leave them (testing::CaseSpec::fork_members), so the CPU
// backend's shared prefixes (docs/shared_prefix.md) see groups of every size and shape.
#include <algorithm>

#include "draw_parts.hpp"

namespace pagedattn::fuzz {

void draw_forks(FuzzCase& c, Rng& r) {
  testing::CaseSpec& s = c.spec;
  if (s.batch < 2 || !r.chance(0.25)) return;
  s.fork_members = r.chance(0.3) ? s.batch : r.uniform(2, std::min(s.batch, 8));
  const int groups = (s.batch + s.fork_members - 1) / s.fork_members;
  s.fork_prefix.clear();
  for (int g = 0; g < groups; ++g) {
    const auto first = s.context_lens.begin() + g * s.fork_members;
    const auto last = s.context_lens.begin() + std::min(s.batch, (g + 1) * s.fork_members);
    const int longest = std::max(1, *std::max_element(first, last));
    const int BS = s.block_size, blocks = std::max(1, longest / BS);
    const double u = r.real();
    int fork;
    if (u < 0.1) {
      fork = 0;  // a group that never forked: nothing shared
    } else if (u < 0.35) {
      fork = r.uniform(1, blocks) * BS;  // on a block boundary
    } else if (u < 0.6) {
      fork = r.uniform(0, blocks) * BS + r.uniform(1, std::max(1, BS - 1));  // inside a block
    } else if (u < 0.8) {
      fork = longest;  // every member as long as its context allows: whole tables shared
    } else {
      fork = r.uniform(1, longest);
    }
    s.fork_prefix.push_back(fork);
  }
  // A group past the last prefix drawn does not fork: the batch mixes groups and loners.
  if (groups > 1 && r.chance(0.2)) s.fork_prefix.pop_back();
}

}  // namespace pagedattn::fuzz
