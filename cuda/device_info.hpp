// What the CUDA backend needs to know of a device: whether it can run the kernels this library
// was built with, its SM count, and whether it has programmatic dependent launch (sm_90 and
// newer). Read once per device.
#pragma once

#include <string>

#include "split_build.hpp"

namespace pagedattn::detail::cuda {

struct DeviceInfo {
  int device = -1;
  int sms = 0;
  int cc_major = 0, cc_minor = 0;
  bool pdl = false;  // programmatic dependent launch (griddepcontrol): sm_90 with sm_90 code
  SmemFacts smem;
};

// The current device's facts (cached per device; thread-safe). Throws pagedattn::Error on a CUDA
// runtime error.
const DeviceInfo& current_device();

// Whether the current device can run this library's kernels; when not, `why` names the reason:
// no driver, a driver older than the CUDA runtime the library was built with, no device, a
// compute capability below 8.0, or no kernel image for the device's architecture.
bool device_usable(std::string* why);

}  // namespace pagedattn::detail::cuda
