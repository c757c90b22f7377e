// The oracles a fuzz case goes through: each backend against the f64 reference, backends against
// each other, the planner's split plan against a single split, a sequence's bits in a
// batch-invariant decode against another batch's, every output written and finite,
// the gaps of a strided out never written, and malformed inputs rejected with the documented
// error and the outputs untouched. The checks themselves: output_checks.hpp, tolerance.hpp,
// batch_invariance_check.hpp, context_parallel_check.hpp.
#pragma once

#include <string>
#include <vector>

#include "fuzz_case.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::fuzz {

struct CheckOptions {
  std::vector<Backend> backends = {Backend::kCpu};
  int threads = 0;  // > 0 overrides the case's CPU thread count
};

enum class Verdict {
  kPass,
  kInapplicable,  // the case cannot be built (a shrink step made its malformation impossible)
  kFail,
};

struct Outcome {
  Verdict verdict = Verdict::kPass;
  std::string oracle;      // which check failed: "reference", "finite", "gap", "plan", "cross", ...
  std::string message;     // what and where
  double worst_ratio = 0;  // largest error / tolerance seen over the numeric checks
  int invariance_checks = 0;     // backends whose batch-invariance check ran and held
  int shared_prefix_checks = 0;  // backends whose shared-prefix check ran and held
  // Backends that refused the case as unsupported (kUnsupported naming kv_lora_rank: no MLA
  // kernel), which then count as neither passing nor failing it.
  int unsupported = 0;
  bool failed() const { return verdict == Verdict::kFail; }
};

Outcome check_case(const FuzzCase& c, const CheckOptions& options);

}  // namespace pagedattn::fuzz
