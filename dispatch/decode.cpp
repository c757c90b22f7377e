// decode(): validation, backend selection, then the backend.
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {

namespace detail {

void decode(const DecodeArgs& args, const DecodeOptions& options) {
  validate_shapes(args);
  validate_options(options);
  const Backend backend = resolve_backend(options.backend);
  if (backend == Backend::kCuda) {  // even for a batch of 0
    require_cuda_head_dim(args.head_dim);
    require_cuda_cache_dtype("k_dtype", args.k_dtype);
  }
  if (args.batch == 0) return;
  if (backend == Backend::kCuda) {
    cuda::decode(args, options);  // validates device-resident tables itself
    return;
  }
  validate_q_indptr(args, args.q_indptr);
  validate_tree_mask(args, args.tree_mask, args.tree_mask_indptr, args.q_indptr);
  validate_tables(args, args.context_lens, args.block_table, args.q_indptr);
  validate_variant_values(args, args.alibi_slopes, args.sinks);
  validate_kv_scales(args, args.k_scales, args.v_scales);
  validate_token_scales(args, args.k_token_scales, args.v_token_scales, args.context_lens,
                        args.block_table, args.q_indptr);
  cpu::decode(args, options);
}

}  // namespace detail

void decode(const DecodeArgs& args, const DecodeOptions& options) {
  detail::decode(args, detail::DecodeOptions(options));
}

}  // namespace pagedattn
