// Runs a built fuzz case on one backend with the planted fault (fault_injection.hpp): the CPU
// backend over the host buffers, the CUDA backend over device copies of them, its outputs copied
// back into the host's.
#pragma once

#include "build_case.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::fuzz {

// `single_split`: one split per sequence instead of the planner's plan. `checked`: the CUDA
// backend validates its device-resident tables and variant values (the CPU path always does).
// `batch_invariant`, `share_prefixes`: those DecodeOptions.
void run_backend(Backend backend, const BuiltCase& bc, int threads, bool single_split, bool checked,
                 bool batch_invariant = false, bool share_prefixes = true);

}  // namespace pagedattn::fuzz
