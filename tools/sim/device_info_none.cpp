// Built when the CUDA backend is not: the device queries report the backend as unavailable.
#include "pagedattn/error.hpp"
#include "sim/machine.hpp"

namespace pagedattn::sim {

double device_free_bytes() {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: built without CUDA");
}

double device_read_ceiling_gbps() {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: built without CUDA");
}

}  // namespace pagedattn::sim
