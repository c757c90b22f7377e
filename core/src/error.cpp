#include "pagedattn/error.hpp"

namespace pagedattn {

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kOutOfRange:
      return "out of range";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kBackendUnavailable:
      return "backend unavailable";
    case ErrorCode::kDeviceError:
      return "device error";
  }
  return "unknown";
}

}  // namespace pagedattn
