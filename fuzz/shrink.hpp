// Shrinks a failing case to a minimal one that still fails the same oracle: fewer sequences, one
// or fewer query tokens, no tree mask (or a smaller one, packed back to back), shorter contexts,
// fewer and plainer attention variants, dense q and out, smaller dims, simpler tables, plainer
// dtypes, scales and values.
#pragma once

#include <functional>

#include "fuzz_case.hpp"
#include "oracle.hpp"

namespace pagedattn::fuzz {

struct ShrinkStats {
  int evaluations = 0;
  int accepted = 0;
};

// `fails` says whether a candidate still shows the failure. Greedy: the first smaller candidate
// that still fails replaces the case, until none does or `max_evaluations` is reached.
FuzzCase shrink_case(const FuzzCase& failing, const std::function<bool(const FuzzCase&)>& fails,
                     int max_evaluations, ShrinkStats* stats = nullptr);

}  // namespace pagedattn::fuzz
