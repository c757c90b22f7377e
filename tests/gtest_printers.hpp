// How GoogleTest prints the library's enums in test names and failure messages ("bf16", "cpu"),
// instead of their bytes. Found by argument-dependent lookup in namespace pagedattn.
#pragma once

#include <ostream>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
inline void PrintTo(Backend b, std::ostream* os) { *os << backend_name(b); }

}  // namespace pagedattn
