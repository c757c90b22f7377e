// Backend selection: the one place that turns Backend::kAuto, PAGEDATTN_BACKEND and what was
// built into the backend a call runs on (decode, write_cache and copy_blocks all ask here).
#include <cstdlib>
#include <string>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

Backend parse_backend(const std::string& text, const std::string& argument) {
  if (text == "auto") return Backend::kAuto;
  if (text == "cpu") return Backend::kCpu;
  if (text == "cuda") return Backend::kCuda;
  fail(ErrorCode::kInvalidArgument, argument, "'" + text + "'", "expected auto, cpu or cuda");
}

bool cuda_available(std::string* why) { return detail::cuda::available(why); }

Backend resolve_backend(Backend requested) {
  if (requested == Backend::kAuto) {
    if (const char* env = std::getenv("PAGEDATTN_BACKEND"); env != nullptr && *env != '\0') {
      requested = parse_backend(env, "PAGEDATTN_BACKEND");
    }
  }
  if (requested == Backend::kAuto) return cuda_available() ? Backend::kCuda : Backend::kCpu;
  if (requested == Backend::kCuda) {
    std::string why;
    if (!cuda_available(&why)) {
      fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: " + why);
    }
  }
  return requested;
}

}  // namespace pagedattn
