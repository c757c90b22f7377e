// Linked when the library is built without the CUDA backend: there is no CUDA status to check.
#include "pagedattn/detail/cuda_status.hpp"
#include "pagedattn/error.hpp"

namespace pagedattn::detail {

void check_cuda_status(int, const char*) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

}  // namespace pagedattn::detail
