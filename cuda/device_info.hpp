// What the CUDA backend needs to know of a device: whether it can run the kernels this library
// was built with, its SM count, whether it has programmatic dependent launch (sm_90 and newer)
// and its shared memory. Read once per device.
#pragma once

#include <string>

namespace pagedattn::detail::cuda {

// An SM's shared memory, as the CUDA runtime reports it.
struct SmemFacts {
  int per_sm = 0;            // of one SM
  int reserved_per_cta = 0;  // what the system takes of it for each resident CTA
  int optin_per_cta = 0;     // the most one CTA may ask for
};

// The dynamic shared memory per CTA at which no more than `ctas` CTAs fit on one SM, and no less
// than `smem` (what the kernel needs): the smallest size that leaves no room for one more. 0 when
// no size within the per-CTA limit does it.
constexpr int shared_memory_for_residency(const SmemFacts& f, int smem, int ctas) {
  if (ctas < 1) return 0;
  // ctas + 1 CTAs of s bytes fit while (ctas + 1) * (s + reserved) <= per_sm.
  const int leaves_no_room = f.per_sm / (ctas + 1) - f.reserved_per_cta + 1;
  const int s = smem > leaves_no_room ? smem : leaves_no_room;
  return s <= f.optin_per_cta ? s : 0;
}

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
