// The generator every draw of a fuzz case goes through, so that a case is a function of the
// generator's seed alone, and the seeds of its streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

namespace pagedattn::fuzz {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  std::uint64_t next() { return g_(); }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }
  double real() { return std::uniform_real_distribution<double>(0.0, 1.0)(g_); }
  bool chance(double p) { return real() < p; }
  template <class T, std::size_t N>
  T pick(const T (&values)[N]) {
    return values[static_cast<std::size_t>(uniform(0, static_cast<int>(N) - 1))];
  }

 private:
  std::mt19937_64 g_;
};

// A stream of its own for one part of the case at (seed, index), told apart by `salt` and `odd`:
// a case without that part keeps every other draw.
inline Rng stream_rng(std::uint64_t seed, std::uint64_t index, std::uint64_t salt,
                      std::uint64_t odd) {
  return Rng(splitmix64(splitmix64(seed ^ salt) ^ (index * 0x9e3779b97f4a7c15ull + odd)));
}

}  // namespace pagedattn::fuzz
