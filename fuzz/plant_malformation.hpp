// Plants a fuzz case's malformation (FuzzCase::bad, chosen by bad_param) in its built arguments
// or the host copies they point at, and records the error the API must raise for it.
#pragma once

#include "build_case.hpp"
#include "fuzz_case.hpp"

namespace pagedattn::fuzz {

// Throws std::invalid_argument when the malformation does not apply to the case (a shrink step
// may leave it nothing to corrupt).
void plant_malformation(const FuzzCase& c, BuiltCase& b);

// For the files that plant one family each: the tree-mask malformations (plant_tree_mask.cpp),
// and the refusal of a malformation the case gives nothing to corrupt.
void plant_in_tree_mask(const FuzzCase& c, BuiltCase& b);
[[noreturn]] void not_applicable(const FuzzCase& c);

}  // namespace pagedattn::fuzz
