// The fuzzer's planted bug: set once from the command line (--fault); the oracle runs the CPU
// backend through decode_with_planted_fault, which plants it
// (pagedattn/testing/planted_faults.hpp).
#pragma once

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/testing/planted_faults.hpp"

namespace pagedattn::fuzz {

void set_fault(testing::Fault f);

// detail::decode with the planted bug, if any (testing::decode_with_fault).
void decode_with_planted_fault(const DecodeArgs& args, const detail::DecodeOptions& options);

}  // namespace pagedattn::fuzz
