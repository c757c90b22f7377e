// The shared-prefix oracle (DecodeOptions::share_prefixes, docs/shared_prefix.md): where the CPU
// backend reads a case's shared prefixes once per group, the plain decode must agree with it.
#pragma once

#include <string>

#include "build_case.hpp"
#include "output_checks.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {

// On the CPU backend, a valid case whose tables hold groups the backend shares
// (detail::cpu::shared_prefixes) decoded again with share_prefixes off: every output written and
// finite, and within `tol` of `shared`, the run with sharing (its planner's plan). `ran` says
// whether the case shared anything. Empty when the check holds or does not apply.
std::string check_shared_prefixes(Backend backend, BuiltCase& bc, const Outputs& shared,
                                  const Tolerance& tol, int threads, bool* ran);

}  // namespace pagedattn::fuzz
