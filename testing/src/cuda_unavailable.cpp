// Built when the CUDA backend is not: device memory and the CUDA round trip report the backend as
// unavailable (device_memory.cu and device_case.cu stand in for them with CUDA).
#include "pagedattn/error.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"

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

}  // namespace pagedattn::testing
