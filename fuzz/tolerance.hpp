// The tolerances a valid fuzz case's outputs are held to, relative to its f64 reference (see
// docs/fuzzing.md): the output dtype's rounding, the f32 error of the logits where they are not
// exact, the soft-cap's and ALiBi's own rounding, and what a logit error does to the softmax.
#pragma once

#include <vector>

#include "build_case.hpp"
#include "fuzz_case.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"

namespace pagedattn::fuzz {

// Per (sequence, head) row: with sinks, rows differ by orders of magnitude in lse and in how much
// of the softmax their tokens hold.
struct Tolerance {
  std::vector<double> out_abs;  // on |out - ref out|, for every element of the row
  std::vector<double> lse_abs;  // on |lse - ref lse| over finite lse
  double logit_err = 0;         // the f32 logit error bound folded in (0 for exact logits)
};

// The bounds for `backend`'s outputs (the CUDA backend's are never tighter than the CPU's).
Tolerance tolerance_for(const FuzzCase& c, const BuiltCase& bc, const ReferenceResult& ref,
                        Backend backend);

// The bounds for an MLA decode's outputs (mla_tolerance.cpp), the same policy over its logits of
// kv_lora_rank + rope_dim terms, for any backend.
Tolerance mla_tolerance_for(const MlaDecodeArgs& a, const ReferenceResult& ref);

}  // namespace pagedattn::fuzz
