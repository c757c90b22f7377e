// What the GQA and the MLA oracles (oracle.cpp, mla_oracle.cpp) share: the outcomes they return
// and their last check, the backends that ran a case against each other.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "oracle.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::fuzz {

// A failing outcome: `oracle` names the check, `message` says what and where.
inline Outcome failure(const std::string& oracle, const std::string& message) {
  Outcome o;
  o.verdict = Verdict::kFail;
  o.oracle = oracle;
  o.message = message;
  return o;
}

// The outcome of a case that cannot be built (`why`: what build_case or build_mla_case said).
inline Outcome inapplicable(const std::string& why) {
  Outcome o;
  o.verdict = Verdict::kInapplicable;
  o.message = why;
  return o;
}

// Each backend's outputs against those of the first that ran (runs[0]): differ(run, baseline)
// says where the two differ ("" where they agree). The "cross" failure of the first run that
// differs, else a passing outcome.
template <class Outputs, class Differ>
Outcome compare_backends(const std::vector<std::pair<Backend, Outputs>>& runs, Differ&& differ) {
  for (std::size_t i = 1; i < runs.size(); ++i) {
    if (std::string bad = differ(runs[i].second, runs[0].second); !bad.empty()) {
      return failure("cross", std::string(backend_name(runs[i].first)) + " vs " +
                                  backend_name(runs[0].first) + ": " + bad);
    }
  }
  return {};
}

}  // namespace pagedattn::fuzz
