// Runs decode on the CUDA backend over host buffers: copies the inputs to the device, runs, and
// copies out and lse back. For tools and tests that build their cases on the host.
#pragma once

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::testkit {

// `host` points at host memory; options.backend is ignored (always CUDA).
void cuda_decode_from_host(const DecodeArgs& host, const detail::DecodeOptions& options);

}  // namespace pagedattn::testkit
