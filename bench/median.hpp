// The median the CUDA timings and pagedattn-cp-bench report: the upper middle of the sorted
// samples (a sample that was measured, never an average of two), 0 for none.
#pragma once

#include <algorithm>
#include <vector>

namespace pagedattn::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace pagedattn::bench
