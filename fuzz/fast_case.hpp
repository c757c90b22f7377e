// The fuzzer's case builder: the same layout and the same traps as testing::make_case (a
// permuted oversized pool, prefix sharing, -1 and garbage past each context, NaN in every slot no
// sequence reads), with a generator cheap enough for thousands of cases a minute, and two traps
// more: stale in-range ids past a context and prefixes shared with any earlier sequence.
#pragma once

#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::fuzz {

testing::HostCase make_fast_case(const testing::CaseSpec& spec);

}  // namespace pagedattn::fuzz
