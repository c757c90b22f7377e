// Runs a built MLA case through the public mla_decode on one backend: the CPU backend over the
// host buffers, the CUDA backend over device copies of them (the tables and q_indptr included,
// as the CUDA backend reads them in device memory), out and lse copied back into the host's
// whether the call succeeds or throws, so that a write before a refusal shows.
#pragma once

#include "build_mla.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::fuzz {

// `checked`: DecodeOptions::cuda_checked (the CPU backend always checks).
void run_mla(Backend backend, BuiltMla& m, int threads, bool batch_invariant, bool checked);

}  // namespace pagedattn::fuzz
