// Inputs rotated over copies, so that consecutive timed steps read memory the caches do not hold:
// how many copies to make, and which one a step reads. pagedattn-bench's CPU rows (RotatingCase)
// and its MLA rows rotate this way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace pagedattn::bench {

// How many copies of copy_bytes each together span at least span_bytes: 1 to max_copies.
inline int rotation_copies(double copy_bytes, double span_bytes, int max_copies) {
  return static_cast<int>(std::clamp(std::ceil(span_bytes / std::max(copy_bytes, 1.0)), 1.0,
                                     static_cast<double>(max_copies)));
}

// The copy step i reads: the steps go round the copies in turn.
template <typename Copy>
const Copy& copy_for_step(const std::vector<Copy>& copies, int step) {
  return copies[static_cast<std::size_t>(step) % copies.size()];
}

}  // namespace pagedattn::bench
