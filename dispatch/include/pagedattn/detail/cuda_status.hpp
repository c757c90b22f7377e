// The library's CUDA error check for code outside the backend (the tests, the fuzzer, the
// benchmark, the Python module), so a failed runtime call there becomes the same
// pagedattn::Error as inside it. Not installed.
#pragma once

namespace pagedattn::detail {

// Throws pagedattn::Error (ErrorCode::kDeviceError) naming `what` and the CUDA error when
// `status` (a cudaError_t) is not cudaSuccess. Without the CUDA backend, every call throws
// ErrorCode::kBackendUnavailable: no status can come from a CUDA runtime there.
void check_cuda_status(int status, const char* what);

}  // namespace pagedattn::detail
