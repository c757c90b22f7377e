// The check after a non-finite value was planted in q or K: the heads it reaches are NaN, in the
// backend's result and in the reference's, and every other head is finite and as the reference;
// and the parameter grid of the tests that plant them (test_non_finite.cpp, test_variants.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include "pagedattn/reference.hpp"
#include "pagedattn/testing/poison.hpp"
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

// A non-finite test's parameters: the backend, the dtype of every tensor, and where the bad value
// goes.
using NonFiniteParam = std::tuple<Backend, DType, testing::Poison>;

// Both backends and the three dtypes, each with a NaN or an infinity in q and in a K row, and
// `last_row` (a kKLastRow poison: the last K row of a context that ends inside a block).
inline auto non_finite_params(testing::Poison last_row) {
  using testing::Poison;
  return ::testing::Combine(
      ::testing::Values(Backend::kCpu, Backend::kCuda),
      ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
      ::testing::Values(Poison::kQNaN, Poison::kQPosInf, Poison::kQNegInf, Poison::kKNaN,
                        Poison::kKPosInf, Poison::kKNegInf, last_row));
}

// "cpu_f32_q_nan" and the like.
inline std::string non_finite_name(const ::testing::TestParamInfo<NonFiniteParam>& info) {
  const auto [backend, dtype, poison] = info.param;
  return std::string(backend_name(backend)) + "_" + dtype_name(dtype) + "_" +
         testing::poison_name(poison);
}

}  // namespace pagedattn
