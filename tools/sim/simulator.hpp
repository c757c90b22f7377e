// The continuous-batching loop of pagedattn-sim. See docs/simulator.md.
#pragma once

#include "sim/options.hpp"

namespace pagedattn::sim {

// Runs the simulation, prints the summary on stdout; returns the exit code (0: every sampled
// step matched the f64 reference, 1: a mismatch).
int run(const Options& options);

}  // namespace pagedattn::sim
