// write_mla_cache() and the MLA copy_blocks(): validation, then backend selection exactly as
// write_cache() does it, then the backend.
#include "pagedattn/mla_cache.hpp"

#include "pagedattn/detail/cache_backends.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {

void write_mla_cache(const MlaCacheWriteArgs& args, const CacheOpOptions& options) {
  detail::validate_mla_write_args(args);
  validate_options(options);
  const Backend backend = resolve_backend(options.backend);
  if (args.num_tokens == 0) return;
  if (backend == Backend::kCuda) {
    detail::cuda::write_mla_cache(args, options);  // checks device-resident slots itself
    return;
  }
  detail::validate_mla_slots(args, args.slot_mapping);
  detail::cpu::write_mla_cache(args, options);
}

void copy_blocks(const MlaCopyBlocksArgs& args, const CacheOpOptions& options) {
  detail::validate_mla_copy_args(args);
  validate_options(options);
  const Backend backend = resolve_backend(options.backend);
  if (args.num_pairs == 0) return;
  if (backend == Backend::kCuda) {
    detail::cuda::copy_blocks(args, options);
    return;
  }
  detail::cpu::copy_blocks(args, options);
}

}  // namespace pagedattn
