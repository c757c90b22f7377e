// Built when the CUDA backend is not: the round trip reports the backend as unavailable.
#include "device_roundtrip.hpp"

namespace pagedattn::testkit {

void cuda_decode_from_host(const DecodeArgs&, const detail::DecodeOptions&) {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}

}  // namespace pagedattn::testkit
