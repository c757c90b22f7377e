// Drawing fuzz cases: the case at (seed, index) is a pure function of the pair and the draw
// options, so any case of a run can be drawn again alone (pagedattn-fuzz --index).
#pragma once

#include <cstdint>

#include "fuzz_case.hpp"

namespace pagedattn::fuzz {

// Draw knobs: which backends the case must suit.
struct DrawOptions {
  bool table_malformations_only = false;  // CUDA runs only malformations that keep buffer sizes
  // The CUDA backend runs too: strided rows are aligned as it needs in most cases (85% rather
  // than half), so that most strided cases reach its kernels rather than its alignment refusal.
  bool cuda = false;
};

// The case at (seed, index). Pure: the same pair (and options) always gives the same case.
FuzzCase draw_case(std::uint64_t seed, std::uint64_t index, const DrawOptions& options = {});

// Total K (or V) cache elements of the case's pool, used blocks plus spare ones: the cost bound
// draw_case keeps every case within.
std::int64_t kv_elements(const FuzzCase& c);

}  // namespace pagedattn::fuzz
