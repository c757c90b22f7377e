// Seeds for randomized tests: PAGEDATTN_TEST_SEED replays a run; every failure prints the seed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace pagedattn::testing {

// The base seed: PAGEDATTN_TEST_SEED if set, else a fixed default (runs are reproducible).
inline std::uint64_t base_seed() {
  const char* env = std::getenv("PAGEDATTN_TEST_SEED");
  return env && *env ? std::strtoull(env, nullptr, 0) : 20261129u;
}

// A per-test seed derived from the base seed and a salt, so cases differ but replay together.
inline std::uint64_t seed_for(std::uint64_t salt) {
  std::uint64_t x = base_seed() ^ (salt * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

// FNV-1a of a string: the same value from every standard library (std::hash is not).
inline std::uint64_t stable_hash(const std::string& s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The seed of the running test, salted with its name.
inline std::uint64_t seed_for_test() {
  return seed_for(stable_hash(::testing::UnitTest::GetInstance()->current_test_info()->name()));
}

inline std::string seed_note(std::uint64_t seed) {
  return "seed " + std::to_string(seed) +
         " (replay the run with PAGEDATTN_TEST_SEED=" + std::to_string(base_seed()) + ")";
}

}  // namespace pagedattn::testing
