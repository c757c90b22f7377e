// The fuzzer's planted bug: set once from the command line (--fault), read by the oracle, which
// passes it to the CPU backend through the internal options (detail::DecodeOptions::fault).
#pragma once

#include "pagedattn/detail/backends.hpp"

namespace pagedattn::fuzz {

void set_fault(detail::Fault f);
detail::Fault planted_fault();

}  // namespace pagedattn::fuzz
