// The internal seam between the API and the backends. Arguments arrive validated.
#pragma once

#include <cstddef>
#include <string>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::detail {

namespace cpu {
// Runs on host memory; context_lens and block_table already validated.
void decode(const DecodeArgs& args, const DecodeOptions& options);
}  // namespace cpu

namespace cuda {
// Whether the CUDA backend was built and a device is usable; `why` says what is missing.
bool available(std::string* why);
// Runs on device memory.
void decode(const DecodeArgs& args, const DecodeOptions& options);
// Device workspace bytes decode needs for these shapes (see pagedattn::cuda_workspace_size).
std::size_t workspace_size(const DecodeArgs& args);
}  // namespace cuda

}  // namespace pagedattn::detail
