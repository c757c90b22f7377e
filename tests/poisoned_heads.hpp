// The check after a non-finite value was planted in q or K: the heads it reaches are NaN, in the
// backend's result and in the reference's, and every other head is finite and as the reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"

namespace pagedattn {

// bad_head[b * H + h]: the heads whose result must be NaN. An infinite reference lse (an empty
// context without a sink) must be matched exactly.
inline void expect_nan_in_poisoned_heads(const testing::HostCase& c, const ReferenceResult& ref,
                                         const std::vector<bool>& bad_head) {
  const DType dtype = c.spec.out_dtype;
  const int H = c.spec.num_heads, D = c.spec.head_dim;
  double scale = 1e-30, err = 0, lse_err = 0;
  for (int b = 0; b < c.spec.batch; ++b) {
    for (int h = 0; h < H; ++h) {
      const std::size_t row = static_cast<std::size_t>(b) * H + h;
      if (bad_head[row]) {
        for (int d = 0; d < D; ++d) {
          ASSERT_TRUE(std::isnan(ref.out[row * D + d])) << "reference, seq " << b << " head " << h;
          ASSERT_TRUE(std::isnan(load_as_float(c.out.data(), dtype, row * D + d)))
              << "seq " << b << " head " << h << " out[" << d
              << "] = " << load_as_float(c.out.data(), dtype, row * D + d);
        }
        EXPECT_TRUE(std::isnan(ref.lse[row])) << "reference, seq " << b << " head " << h;
        EXPECT_TRUE(std::isnan(c.lse[row]))
            << "seq " << b << " head " << h << " lse = " << c.lse[row];
        continue;
      }
      for (int d = 0; d < D; ++d) {
        const double got = load_as_float(c.out.data(), dtype, row * D + d);
        const double want = ref.out[row * D + d];
        ASSERT_TRUE(std::isfinite(got)) << "seq " << b << " head " << h << " out[" << d << "]";
        scale = std::max(scale, std::fabs(want));
        err = std::max(err, std::fabs(got - want));
      }
      if (std::isinf(ref.lse[row])) {
        EXPECT_EQ(c.lse[row], ref.lse[row]) << "seq " << b << " head " << h;
      } else {
        ASSERT_TRUE(std::isfinite(c.lse[row])) << "seq " << b << " head " << h;
        lse_err = std::max(lse_err, std::fabs(c.lse[row] - ref.lse[row]));
      }
    }
  }
  EXPECT_LE(err / scale, testing::out_tolerance(dtype));
  EXPECT_LE(lse_err, testing::lse_tolerance());
}

}  // namespace pagedattn
