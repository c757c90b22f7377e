// Built when the CUDA backend is not: device memory is unavailable.
#include "pagedattn/error.hpp"
#include "sim/device_memory.hpp"

namespace pagedattn::sim {
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

}  // namespace pagedattn::sim
