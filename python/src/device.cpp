#include "device.hpp"

#include "argument_error.hpp"

#if PAGEDATTN_PY_CUDA
#include <cuda_runtime_api.h>

#include "pagedattn/detail/cuda_status.hpp"
#endif

namespace pagedattn::py {

#if PAGEDATTN_PY_CUDA
namespace {
void check(cudaError_t err, const char* what) {
  pagedattn::detail::check_cuda_status(static_cast<int>(err), what);
}
}  // namespace
#endif

DeviceGuard::DeviceGuard(const Device& d) {
#if PAGEDATTN_PY_CUDA
  if (d.kind != DeviceKind::kCuda) return;
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != d.id) {
    check(cudaSetDevice(d.id), "cudaSetDevice");
    previous_ = current;
  }
#else
  (void)d;
#endif
}

DeviceGuard::~DeviceGuard() {
#if PAGEDATTN_PY_CUDA
  if (previous_ >= 0) cudaSetDevice(previous_);
#endif
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, std::uintptr_t stream,
                  const char* what) {
#if PAGEDATTN_PY_CUDA
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), what);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
#else
  (void)dst, (void)src, (void)bytes, (void)stream, (void)what;
#endif
}

Backend pick_backend(const std::string& requested, const Device& device, const char* ref) {
  const Backend b = pagedattn::parse_backend(requested, "backend");
  const Backend want = device.kind == DeviceKind::kCuda ? Backend::kCuda : Backend::kCpu;
  if (want == Backend::kCuda || b == Backend::kCuda) {
    pagedattn::resolve_backend(Backend::kCuda);  // kBackendUnavailable, saying why
  }
  if (b != Backend::kAuto && b != want) {
    reject(ErrorCode::kInvalidArgument, "backend", "", "'" + requested + "'",
           std::string("does not match the device of ") + ref + " (" + device.str() + ")");
  }
  return want;
}

}  // namespace pagedattn::py
