// mla_decode(): validation, backend selection, then the backend. What the CUDA backend has no
// kernel for is refused (kUnsupported) before anything is read, whatever the batch.
#include "pagedattn/mla.hpp"

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/mla_validate.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {

namespace detail {

void mla_decode(const MlaDecodeArgs& args, const DecodeOptions& options) {
  validate_mla_shapes(args);
  validate_options(options);
  if (resolve_backend(options.backend) == Backend::kCuda) {
    cuda::check_mla_launch(args, options);
    if (args.batch > 0) cuda::mla_decode(args, options);
    return;
  }
  if (args.batch == 0) return;
  validate_mla_tables(args);
  cpu::mla_decode(args, options);
}

}  // namespace detail

void mla_decode(const MlaDecodeArgs& args, const DecodeOptions& options) {
  detail::mla_decode(args, detail::DecodeOptions(options));
}

}  // namespace pagedattn
