// What the oracles read back from a run and the checks on it: the outputs widened to double,
// every element written and finite, out's gaps untouched, agreement with another run or the
// reference within a tolerance. Each check returns an empty string when it holds, else a message
// that names the element (and, with multi-token queries, the query token).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "build_case.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {

// Outputs of one run, widened to double.
struct Outputs {
  std::vector<double> out, lse;
};

// The `rows` rows of `out` (rows of `stride` elements), dense, and lse.
Outputs read_outputs(const testing::HostCase& h, int rows, const std::vector<std::uint8_t>& out,
                     std::int64_t stride, const std::vector<float>& lse);
// The case's own outputs (its out buffer at its stride, and host.lse).
Outputs read_outputs(const BuiltCase& bc);

// Out's gaps untouched, and nothing written by a call without query tokens.
std::string check_gaps(const BuiltCase& bc);

// Compares `got` with `want` (the reference or another run), each (row, head) within its bound of
// `tol`; `ratio` gets the worst error / tolerance.
std::string compare(const BuiltCase& bc, const Outputs& got, const std::vector<double>& want_out,
                    const std::vector<double>& want_lse, const Tolerance& tol, double* ratio);

// Every element written and finite, an empty context's lse -inf or the sink (see the definition).
std::string check_finite(const Outputs& r, const BuiltCase& bc, const float* sinks);

// The reference over the case's laid-out K and V against `dense`, the one over the dense cache.
std::string check_layout_reference(const BuiltCase& bc, const ReferenceResult& dense);

}  // namespace pagedattn::fuzz
