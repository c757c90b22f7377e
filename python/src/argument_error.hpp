// The module's own argument errors: pagedattn::Error naming the Python argument, worded as the
// library words its errors ("pagedattn: <argument><what> = <value>: <reason>").
#pragma once

#include <string>

#include "pagedattn/error.hpp"

namespace pagedattn::py {

// Throws "<argument><what> = <value>: <reason>"; `what` is a suffix such as ".dtype" or "[3]".
[[noreturn]] inline void reject(ErrorCode code, const std::string& argument,
                                const std::string& what, const std::string& value,
                                const std::string& reason) {
  throw Error(code, argument, argument + what + " = " + value + ": " + reason);
}

}  // namespace pagedattn::py
