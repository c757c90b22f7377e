// The seam between the dispatch layer's merge_states() and the backends. Arguments arrive
// validated, with at least one row. Not installed.
#pragma once

#include "pagedattn/merge_states.hpp"
#include "pagedattn/online_softmax.hpp"

namespace pagedattn::detail {

// The state a segment's (out, lse) stands for: (m = lse, l = 1) with acc = out, since
// out = acc / l and lse = m + log(l). An empty segment (lse = -inf) is the empty state, and a NaN
// lse gives l = NaN too, so that the NaN survives every merge and the finalization.
PAGEDATTN_HOST_DEVICE SoftmaxState segment_state(float lse) {
  return SoftmaxState{lse, lse == -INFINITY ? 0.f : (lse != lse ? lse : 1.f)};
}

namespace cpu {
void merge_states(const MergeStatesArgs& args, const MergeStatesOptions& options);
}  // namespace cpu

namespace cuda {
void merge_states(const MergeStatesArgs& args, const MergeStatesOptions& options);
}  // namespace cuda

}  // namespace pagedattn::detail
