// Where a tensor lives (the host or one CUDA device), the backend that serves it, and the few
// CUDA runtime calls the module makes itself. device.cpp is the one file that includes the
// CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::py {

enum class DeviceKind { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int id = 0;
  bool operator==(const Device& o) const {
    return kind == o.kind && (kind == DeviceKind::kCpu || id == o.id);
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    return kind == DeviceKind::kCpu ? "cpu" : "cuda:" + std::to_string(id);
  }
};

// Makes the tensors' device current for the library's CUDA calls, and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Copies `bytes` of device memory to the host on `stream` (after the work queued on it, which
// may write `src`) and waits for the copy; a failure is a device error naming `what`. Only a
// module built with CUDA has device tensors: elsewhere pick_backend refuses them first.
void copy_to_host(void* dst, const void* src, std::size_t bytes, std::uintptr_t stream,
                  const char* what);

// The backend for tensors on `device`: "auto" follows the device (PAGEDATTN_BACKEND is not
// consulted: the tensors' memory decides); an explicit choice must be available and match it.
// `ref` names the tensor whose device decides.
Backend pick_backend(const std::string& requested, const Device& device, const char* ref);

}  // namespace pagedattn::py
