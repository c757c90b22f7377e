// The context-parallel oracle: a valid fuzz case decoded by 2 or 3 ranks of an in-process group
// (context_parallel_decode), each on its share of every sequence's blocks.
#pragma once

#include <string>

#include "build_case.hpp"
#include "fuzz_case.hpp"
#include "oracle.hpp"
#include "pagedattn/reference.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {

// Context parallelism, on the CPU backend when it is tested: the blocks of every sequence shared
// out among 2 or 3 ranks of the in-process group at random cut points (some ranks holding none),
// each rank decoding its share with context_parallel_decode on one thread; every rank must get
// the same bits, and they must pass the finite and reference checks of a plain run. A strided q
// is read as decode reads it. A case with a window, ALiBi slopes, sinks, multi-token queries
// (q_indptr), per-token scales (k_token_scales) or a strided out must be refused instead, on
// every rank alike (kUnsupported naming the first of those fields that is set, out, its gaps and
// lse untouched); a soft-capped one runs, and so does a quantized cache without per-token
// scales. A case refused for its strided out alone runs again with a dense out, so its q is decoded
// too.
// Empty when every check holds; `worst_ratio` gets the worst error / tolerance.
std::string check_context_parallel(const FuzzCase& c, BuiltCase& bc, const ReferenceResult& ref,
                                   const Tolerance& tol, double* worst_ratio,
                                   const CheckOptions& options);

}  // namespace pagedattn::fuzz
