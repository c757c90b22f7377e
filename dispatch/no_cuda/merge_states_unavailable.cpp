// Linked when the library is built without the CUDA backend: merging on CUDA is unavailable.
#include "pagedattn/detail/merge_backends.hpp"

namespace pagedattn::detail::cuda {

void merge_states(const MergeStatesArgs&, const SegmentStrides&, const MergeStatesOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

}  // namespace pagedattn::detail::cuda
