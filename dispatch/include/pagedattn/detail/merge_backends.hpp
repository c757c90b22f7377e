// The seam between the dispatch layer's merge_states() and the backends. Arguments arrive
// validated, with at least one row. Not installed.
#pragma once

#include <cstdint>

#include "pagedattn/merge_states.hpp"
#include "pagedattn/online_softmax.hpp"

namespace pagedattn::detail {

// The state a segment's (out, lse) stands for: (m = lse, l = 1) with acc = out, since
// out = acc / l and lse = m + log(l). An empty segment (lse = -inf) is the empty state, and a NaN
// lse gives l = NaN too, so that the NaN survives every merge and the finalization.
PAGEDATTN_HOST_DEVICE SoftmaxState segment_state(float lse) {
  return SoftmaxState{lse, lse == -INFINITY ? 0.f : (lse != lse ? lse : 1.f)};
}

// Where segment s's states start: parts at s * parts elements, part_lse at s * lse elements.
// The public merge_states has them packed (num_rows * head_dim and num_rows);
// context-parallel decode gathers each rank's out and lse into one block per rank.
struct SegmentStrides {
  std::int64_t parts = 0;
  std::int64_t lse = 0;
  static SegmentStrides packed(const MergeStatesArgs& a) {
    return {static_cast<std::int64_t>(a.num_rows) * a.head_dim, a.num_rows};
  }
};

namespace cpu {
void merge_states(const MergeStatesArgs& args, const SegmentStrides& strides,
                  const MergeStatesOptions& options);
}  // namespace cpu

namespace cuda {
void merge_states(const MergeStatesArgs& args, const SegmentStrides& strides,
                  const MergeStatesOptions& options);
}  // namespace cuda

}  // namespace pagedattn::detail
