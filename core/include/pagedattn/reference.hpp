// The f64 reference: decode attention straight from the definition (two-pass softmax in double).
// It shares no arithmetic with the online-softmax path and is the oracle for tests, the fuzzer
// and the benchmarks. Host memory only.
#pragma once

#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

struct ReferenceResult {
  std::vector<double> out;  // [batch][num_heads][head_dim]
  std::vector<double> lse;  // [batch][num_heads]; -inf for an empty context
};

// Validates like decode() and computes in double from the stored (rounded) inputs.
ReferenceResult reference_decode(const DecodeArgs& args);

}  // namespace pagedattn
