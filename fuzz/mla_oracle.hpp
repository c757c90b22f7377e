// The oracles an MLA fuzz case goes through: each backend's mla_decode against
// mla_reference_decode at the tolerance policy, the default split plan against the
// batch-invariant one, backends against each other, out's gaps never written, and a malformed
// case rejected by every backend with the error naming its argument, nothing written. A backend
// that refuses MLA as unsupported (the CUDA backend until it has an MLA kernel) is counted in
// Outcome::unsupported and passed over.
#pragma once

#include "mla_case.hpp"
#include "oracle.hpp"

namespace pagedattn::fuzz {

Outcome check_mla_case(const MlaFuzzCase& c, const CheckOptions& options);

}  // namespace pagedattn::fuzz
