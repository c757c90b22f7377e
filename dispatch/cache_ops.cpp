// write_cache() and copy_blocks(): validation, then backend selection exactly as decode() does
// it, then the backend.
#include "pagedattn/cache_ops.hpp"

#include "pagedattn/detail/cache_backends.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {

void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options) {
  detail::validate_write_args(args);
  validate_options(options);
  const Backend backend = resolve_backend(options.backend);
  // A pool the CUDA decode cannot read is refused as decode() refuses it.
  if (backend == Backend::kCuda) {
    require_cuda_head_dim(args.head_dim);
    require_cuda_cache_dtype("cache_dtype", args.cache_dtype);
  }
  if (args.num_tokens == 0) return;
  if (backend == Backend::kCuda) {
    detail::cuda::write_cache(args, options);  // checks device-resident slots itself
    return;
  }
  detail::validate_slots(args, args.slot_mapping);
  detail::validate_write_scales(args, args.k_scales, args.v_scales);
  detail::cpu::write_cache(args, options);
}

void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options) {
  detail::validate_copy_args(args);
  validate_options(options);
  const Backend backend = resolve_backend(options.backend);
  if (backend == Backend::kCuda) {
    require_cuda_head_dim(args.head_dim);
    require_cuda_cache_dtype("cache_dtype", args.cache_dtype);
  }
  if (args.num_pairs == 0) return;
  if (backend == Backend::kCuda) {
    detail::cuda::copy_blocks(args, options);
    return;
  }
  detail::cpu::copy_blocks(args, options);
}

}  // namespace pagedattn
