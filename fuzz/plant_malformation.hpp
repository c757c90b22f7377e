// Plants a fuzz case's malformation (FuzzCase::bad, chosen by bad_param) in its built arguments
// or the host copies they point at, and records the error the API must raise for it.
#pragma once

#include "build_case.hpp"
#include "fuzz_case.hpp"

namespace pagedattn::fuzz {

// Throws std::invalid_argument when the malformation does not apply to the case (a shrink step
// may leave it nothing to corrupt).
void plant_malformation(const FuzzCase& c, BuiltCase& b);

}  // namespace pagedattn::fuzz
