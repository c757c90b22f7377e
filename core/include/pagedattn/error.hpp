// The typed error every entry point throws. The message names the argument and the value.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace pagedattn {

enum class ErrorCode {
  kInvalidArgument,     // a null pointer, a negative size, a shape that does not fit
  kOutOfRange,          // a block id or a context length outside its bounds
  kUnsupported,         // a head_dim, block_size or group size the library has no kernel for
  kBackendUnavailable,  // the requested backend was not built or has no device
  kDeviceError,         // the CUDA runtime reported an error
};

const char* error_code_name(ErrorCode c);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string argument, const std::string& message)
      : std::runtime_error("pagedattn: " + message), code_(code), argument_(std::move(argument)) {}

  ErrorCode code() const noexcept { return code_; }
  // The argument the error is about ("block_table", "head_dim", ...).
  const std::string& argument() const noexcept { return argument_; }

 private:
  ErrorCode code_;
  std::string argument_;
};

// Builds "<argument> = <value>: <reason>" and throws it.
template <typename V>
[[noreturn]] void fail(ErrorCode code, const std::string& argument, const V& value,
                       const std::string& reason) {
  std::ostringstream os;
  os << argument << " = " << value << ": " << reason;
  throw Error(code, argument, os.str());
}

}  // namespace pagedattn
