#include "shared_prefix_check.hpp"

#include <exception>

#include "pagedattn/detail/backends.hpp"
#include "run_backend.hpp"

namespace pagedattn::fuzz {

std::string check_shared_prefixes(Backend backend, BuiltCase& bc, const Outputs& shared,
                                  const Tolerance& tol, int threads, bool* ran) {
  *ran = false;
  if (backend != Backend::kCpu || bc.args.batch < 2) return {};
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  if (detail::cpu::shared_prefixes(bc.args, o).empty()) return {};
  *ran = true;
  bc.poison_outputs();
  try {
    run_backend(backend, bc, threads, false, false, false, /*share_prefixes=*/false);
  } catch (const std::exception& e) {
    return std::string("cpu: threw without sharing: ") + e.what();
  }
  const Outputs plain = read_outputs(bc);
  if (std::string bad = check_finite(plain, bc, bc.args.sinks); !bad.empty()) {
    return "cpu: without sharing: " + bad;
  }
  double ignored = 0;
  if (std::string bad = compare(bc, shared, plain.out, plain.lse, tol, &ignored); !bad.empty()) {
    return "cpu: shared prefixes vs the plain decode: " + bad;
  }
  return {};
}

}  // namespace pagedattn::fuzz
