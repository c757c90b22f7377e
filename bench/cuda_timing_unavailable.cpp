// Built when the CUDA backend is not: every CUDA timing reports the backend as unavailable.
#include "cuda_timing.hpp"

namespace pagedattn::bench {

double cuda_read_ceiling_gbps() {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

double cuda_time_steps(const std::function<void(int, void*)>&, int, void*, bool, int) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

Timing cuda_time_shape(const Shape&, DType, const CudaTimingOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

}  // namespace pagedattn::bench
