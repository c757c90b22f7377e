// Device memory for the simulator (and tests) without the CUDA runtime in their own sources:
// built from device_memory.cu with the CUDA backend, from device_memory_unavailable.cpp without.
#pragma once

#include <cstddef>

namespace pagedattn::sim {

// Whether these functions work in this build (the CUDA backend was built).
bool device_memory_built();
// All throw pagedattn::Error (kDeviceError, or kBackendUnavailable without CUDA).
void* device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void device_fill(void* dst, int byte, std::size_t bytes);
void device_synchronize();

// One device allocation, freed on destruction.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(std::size_t bytes) : p_(bytes ? device_alloc(bytes) : nullptr), n_(bytes) {}
  DeviceBytes(const void* host, std::size_t bytes) : DeviceBytes(bytes) {
    if (bytes) copy_to_device(p_, host, bytes);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceBytes(DeviceBytes&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBytes& operator=(DeviceBytes&& o) noexcept {
    if (this != &o) {
      device_free(p_);
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~DeviceBytes() { device_free(p_); }
  void* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace pagedattn::sim
