// pagedattn-sim: a serving loop over the paged cache (cache writes, the block manager with forks
// and copy-on-write, decode attention per layer), checked against the f64 reference.
#include <cstdio>

#include "pagedattn/cli/args.hpp"
#include "sim/options.hpp"
#include "sim/simulator.hpp"

int main(int argc, char** argv) {
  return pagedattn::cli::guarded_main("pagedattn-sim", [&] {
    const pagedattn::sim::Options options = pagedattn::sim::parse_options(argc, argv);
    if (options.help) {
      std::fputs(pagedattn::sim::usage(argv[0]).c_str(), stdout);
      return 0;
    }
    return pagedattn::sim::run(options);
  });
}
