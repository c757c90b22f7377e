// The one check of a decoded case against the f64 reference: every output written and finite, out
// and lse inside the tolerance policy (testing/tolerance.hpp). A failure names the case, its seed
// and `what`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn::testing {

inline void expect_matches_reference(HostCase& c, const std::string& what = "") {
  const Comparison cmp = compare_with_reference(c);
  SCOPED_TRACE((what.empty() ? "" : what + ": ") + describe(c.spec) + " " + seed_note(c.spec.seed));
  EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), out_tolerance(c.spec.out_dtype));
  EXPECT_LE(cmp.max_abs_err_lse, lse_tolerance());
}

}  // namespace pagedattn::testing
