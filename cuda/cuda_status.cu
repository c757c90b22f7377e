// check_cuda_status (pagedattn/detail/cuda_status.hpp): the backend's own check, exported.
#include "cuda_error.hpp"
#include "pagedattn/detail/cuda_status.hpp"

namespace pagedattn::detail {

void check_cuda_status(int status, const char* what) {
  cuda::check(static_cast<cudaError_t>(status), what);
}

}  // namespace pagedattn::detail
