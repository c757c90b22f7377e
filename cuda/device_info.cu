// Device facts and the usability check behind pagedattn::cuda_available (device_info.hpp).
#include <cuda_runtime.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <string>

#include "combine.cuh"
#include "cuda_error.hpp"
#include "device_info.hpp"

namespace pagedattn::detail::cuda {
namespace {

std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

const DeviceInfo& current_device() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  static std::mutex mu;
  // A deque: growing it for a new device keeps the references handed out for the others valid.
  static std::deque<DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(cache.size()) <= dev) cache.resize(dev + 1);
  DeviceInfo& d = cache[dev];
  if (d.device < 0) {
    check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, dev),
          "cudaDeviceGetAttribute");
    // Programmatic launches only where the kernels' code has griddepcontrol in it: an
    // sm_80-only build running on Hopper through PTX compiled none, and launched as a dependent
    // it would not wait for the kernel before it.
    d.pdl = d.cc_major >= 9 && kernels_ptx_version() >= 90;
    check(cudaDeviceGetAttribute(&d.smem.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.smem.reserved_per_cta, cudaDevAttrReservedSharedMemoryPerBlock,
                                 dev),
          "cudaDeviceGetAttribute");
    check(
        cudaDeviceGetAttribute(&d.smem.optin_per_cta, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "cudaDeviceGetAttribute");
    d.device = dev;
  }
  return d;
}

bool device_usable(std::string* why) {
  // Every CUDA call asks (backend selection), so a device found usable is remembered: the
  // checks below cost several runtime calls, a few microseconds per call otherwise. A device
  // found unusable is checked again next time.
  constexpr int kKnownDevices = 64;
  static std::atomic<bool> known_usable[kKnownDevices] = {};
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();  // the checks below say why
  } else if (current >= 0 && current < kKnownDevices &&
             known_usable[current].load(std::memory_order_acquire)) {
    return true;
  }
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (driver == 0) return no("no NVIDIA driver is installed");
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver || driver < runtime) {
    cudaGetLastError();
    return no("the NVIDIA driver supports CUDA " + version_text(driver) + ", older than the CUDA " +
              version_text(runtime) + " runtime this library was built with: update the driver");
  }
  if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
    cudaGetLastError();
    return no("no CUDA device present");
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return no(std::string("no usable CUDA device: ") + cudaGetErrorString(err));
  }
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return no("cannot query the current CUDA device");
  }
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  if (major < 8) {
    return no("device " + std::to_string(dev) + " has compute capability " + cc +
              "; the CUDA backend needs 8.0 or newer (A100, RTX 30xx and later)");
  }
  if (!combine_has_image()) {
    cudaGetLastError();
    return no("this build has no kernels for compute capability " + cc +
              " (rebuild with CMAKE_CUDA_ARCHITECTURES including " + std::to_string(major) +
              std::to_string(minor) + ")");
  }
  if (dev < kKnownDevices) known_usable[dev].store(true, std::memory_order_release);
  return true;
}

}  // namespace pagedattn::detail::cuda
