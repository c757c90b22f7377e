// Host-buffer round trip through the CUDA backend.
#include <cuda_runtime.h>

#include "device_roundtrip.hpp"

namespace pagedattn::testkit {

void cuda_decode_from_host(const DecodeArgs&, const DecodeOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: the CUDA kernels are not implemented yet");
}

}  // namespace pagedattn::testkit
