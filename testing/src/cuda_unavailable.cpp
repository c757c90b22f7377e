// Built when the CUDA backend is not: device memory, the CUDA round trip and the naive CUDA decode
// report the backend as unavailable (device_memory.cu, device_case.cu and naive_decode_cuda.cu
// stand in for them with CUDA).
#include "pagedattn/error.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/naive_decode.hpp"

namespace pagedattn::testing {
namespace {
[[noreturn]] void unavailable() {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}
}  // namespace

bool device_memory_built() { return false; }
void* device_alloc(std::size_t) { unavailable(); }
void device_free(void*) noexcept {}
void copy_to_device(void*, const void*, std::size_t) { unavailable(); }
void copy_to_host(void*, const void*, std::size_t) { unavailable(); }
void device_fill(void*, int, std::size_t) { unavailable(); }
void device_synchronize() { unavailable(); }

DeviceCase::DeviceCase(const DecodeArgs&, void*) { unavailable(); }
void DeviceCase::download(const DecodeArgs&, void*) const { unavailable(); }
void cuda_decode_from_host(const DecodeArgs&, const detail::DecodeOptions&) { unavailable(); }
void naive_decode_cuda(const DecodeArgs&) { unavailable(); }

}  // namespace pagedattn::testing
