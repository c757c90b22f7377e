// Device memory for the tests, the fuzzer, the benchmark and the simulator, without the CUDA
// runtime in their own sources: built from src/device_memory.cu with the CUDA backend, from
// src/cuda_unavailable.cpp without. DeviceBuffer is the one owning device allocation they all
// use.
#pragma once

#include <cstddef>
#include <vector>

namespace pagedattn::testing {

// Whether these functions work in this build (the CUDA backend was built).
bool device_memory_built();
// All throw pagedattn::Error (kDeviceError, or kBackendUnavailable without CUDA). The copies and
// the fill are synchronous (cudaMemcpy, cudaMemset).
void* device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void device_fill(void* dst, int byte, std::size_t bytes);
void device_synchronize();

// One device allocation, freed on destruction. A buffer of 0 bytes still holds a valid pointer
// (the library refuses null tensors once batch > 0, whatever their size).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes)
      : p_(device_alloc(bytes < kMinBytes ? kMinBytes : bytes)), n_(bytes) {}
  // A device copy of `bytes` bytes at `host`.
  DeviceBuffer(const void* host, std::size_t bytes) : DeviceBuffer(bytes) {
    if (bytes) copy_to_device(p_, host, bytes);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(p_);
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { device_free(p_); }

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t size() const { return n_; }
  // Copies the first out.size() elements back into `out`.
  template <typename T>
  void to_host(std::vector<T>& out) const {
    if (!out.empty()) copy_to_host(out.data(), p_, out.size() * sizeof(T));
  }

 private:
  static constexpr std::size_t kMinBytes = 16;
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace pagedattn::testing
