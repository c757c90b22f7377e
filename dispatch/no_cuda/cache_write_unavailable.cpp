// Linked when the library is built without the CUDA backend: cache writes on CUDA are unavailable.
#include "pagedattn/detail/cache_backends.hpp"

namespace pagedattn::detail::cuda {

void write_cache(const CacheWriteArgs&, const CacheOpOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

void copy_blocks(const CopyBlocksArgs&, const CacheOpOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

void write_mla_cache(const MlaCacheWriteArgs&, const CacheOpOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

void copy_blocks(const MlaCopyBlocksArgs&, const CacheOpOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

}  // namespace pagedattn::detail::cuda
