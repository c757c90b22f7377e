// mla_decode(): validation, backend selection, then the backend. The CUDA backend has no MLA
// kernel yet: it refuses MLA (kUnsupported) before anything is read, whatever the batch.
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
    fail(ErrorCode::kUnsupported, "kv_lora_rank", args.kv_lora_rank,
         "the CUDA backend has no MLA kernel yet (the CPU backend runs MLA decode)");
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
