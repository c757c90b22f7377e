// The batch-invariance oracle (DecodeOptions::batch_invariant): a sequence's out and lse must be
// the same bits in any batch.
#pragma once

#include <string>

#include "build_case.hpp"
#include "fuzz_case.hpp"
#include "oracle.hpp"
#include "pagedattn/reference.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {

// On `backend`, a valid case decoded batch-invariant twice: whole (held to the reference within
// `tol`, every output written and finite), then inside another batch drawn from the case's seed:
// the batch cut after a random sequence, a random subset of the sequences left kept and every
// other one's context cut short at random (to 0 in a windowed case, whose table entries before a
// window may be garbage), and on the CPU another thread count. Every kept sequence's out rows and
// lse must hold the same bits in both runs. The case's context lengths and arguments are put back
// afterwards. Empty when every check holds; `worst_ratio` gets the worst error / tolerance.
std::string check_batch_invariance(Backend backend, const FuzzCase& c, BuiltCase& bc,
                                   const ReferenceResult& ref, const Tolerance& tol, int threads,
                                   bool checked, double* worst_ratio);

}  // namespace pagedattn::fuzz
