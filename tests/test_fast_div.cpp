// FastDiv (core/include/pagedattn/fast_div.hpp), the CUDA kernels' token-to-block division:
// exact against the hardware divide for every block size the library accepts and for divisors
// up to 2^31 - 1, at the edges of the dividend range and at random dividends.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/fast_div.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

void expect_exact(std::uint32_t d, std::uint32_t n) {
  const FastDiv f = FastDiv::make(d);
  std::uint32_t q = 0, r = 0;
  f.divmod(n, q, r);
  ASSERT_EQ(q, n / d) << "d=" << d << " n=" << n;
  ASSERT_EQ(r, n % d) << "d=" << d << " n=" << n;
}

TEST(FastDiv, EveryBlockSizeOverEdgesAndMultiples) {
  const std::uint32_t top = (std::uint32_t{1} << 31) - 1;
  for (std::uint32_t d = 1; d <= 1024; ++d) {
    for (std::uint32_t k : {0u, 1u, 2u, 3u, 1000u, 65535u, 1u << 20, top / d - 1, top / d}) {
      const std::uint64_t base = std::uint64_t{k} * d;
      for (std::int64_t delta = -1; delta <= 1; ++delta) {
        const std::int64_t n = static_cast<std::int64_t>(base) + delta;
        if (n < 0 || n > top) continue;
        expect_exact(d, static_cast<std::uint32_t>(n));
      }
    }
    for (std::uint32_t n = top; n > top - 64; --n) expect_exact(d, n);
  }
}

TEST(FastDiv, RandomDivisorsAndDividends) {
  const std::uint64_t seed = testing::seed_for_test();
  SCOPED_TRACE("PAGEDATTN_TEST_SEED=" + std::to_string(testing::base_seed()));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> any(0, (std::uint32_t{1} << 31) - 1);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t d = (i % 2 == 0) ? 1 + any(rng) % 4096 : 1 + any(rng) % ((1u << 31) - 1);
    expect_exact(d, any(rng));
  }
}

}  // namespace
}  // namespace pagedattn
