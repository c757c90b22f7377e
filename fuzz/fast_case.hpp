// The fuzzer's case builder: the same layout and the same traps as testing::make_case (a
// permuted oversized pool, prefix sharing, -1 and garbage past each context, NaN in every slot no
// sequence reads), with a generator cheap enough for thousands of cases a minute, and two traps
// more: stale in-range ids past a context and prefixes shared with any earlier sequence.
#pragma once

#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::fuzz {

// window_left >= 0: the case is decoded with that sliding window, so with poison the traps cover
// what the window leaves unread as well: the table entries before each sequence's first attended
// block get -1 or garbage ids, and every slot only unattended tokens map to gets NaN.
testing::HostCase make_fast_case(const testing::CaseSpec& spec, int window_left = -1);

}  // namespace pagedattn::fuzz
