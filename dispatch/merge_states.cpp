// merge_states(): validation, then backend selection exactly as decode() does it, then the
// backend.
#include "pagedattn/merge_states.hpp"

#include "pagedattn/detail/merge_backends.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {

void merge_states(const MergeStatesArgs& args, const MergeStatesOptions& options) {
  validate_merge_args(args);
  validate_options(options);
  const Backend backend = resolve_backend(options.backend);
  if (args.num_rows == 0) return;
  if (backend == Backend::kCuda) {
    detail::cuda::merge_states(args, detail::SegmentStrides::packed(args), options);
    return;
  }
  detail::cpu::merge_states(args, detail::SegmentStrides::packed(args), options);
}

}  // namespace pagedattn
