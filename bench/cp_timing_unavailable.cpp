// pagedattn-cp-bench without the CUDA backend: no devices, and the CUDA measurement is refused.
#include "cp_timing.hpp"

namespace pagedattn::bench {

int cuda_device_count() { return 0; }

CpRow time_cuda(const CpShape&, const std::vector<Communicator*>&, const std::vector<int>&,
                const CpTimingOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

}  // namespace pagedattn::bench
