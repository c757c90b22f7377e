// pagedattn-sim: a serving loop over the paged cache (cache writes, the block manager with forks
// and copy-on-write, decode attention per layer), checked against the f64 reference.
#include <cstdio>

#include "sim/options.hpp"
#include "sim/simulator.hpp"

int main(int argc, char** argv) {
  try {
    return pagedattn::sim::run(pagedattn::sim::parse_options(argc, argv));
  } catch (const pagedattn::Error& e) {
    std::fprintf(stderr, "pagedattn-sim: %s\n", e.what());
    return 2;
  }
}
