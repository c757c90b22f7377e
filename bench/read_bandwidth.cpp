#include "read_bandwidth.hpp"

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pagedattn::bench {
namespace {

// Sums 64-bit words with four independent 32-byte accumulators; the sum keeps the loads alive.
__attribute__((target("avx2"))) std::uint64_t sum_avx2(const char* p, std::size_t bytes) {
  const __m256i* a = reinterpret_cast<const __m256i*>(p);
  const std::size_t n = bytes / 32;
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(a + i));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(a + i + 1));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(a + i + 2));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(a + i + 3));
  }
  s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  alignas(32) std::uint64_t r[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(r), s0);
  return r[0] + r[1] + r[2] + r[3];
}

std::uint64_t sum_sse2(const char* p, std::size_t bytes) {
  const __m128i* a = reinterpret_cast<const __m128i*>(p);
  const std::size_t n = bytes / 16;
  __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    s0 = _mm_add_epi64(s0, _mm_load_si128(a + i));
    s1 = _mm_add_epi64(s1, _mm_load_si128(a + i + 1));
    s2 = _mm_add_epi64(s2, _mm_load_si128(a + i + 2));
    s3 = _mm_add_epi64(s3, _mm_load_si128(a + i + 3));
  }
  s0 = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
  alignas(16) std::uint64_t r[2];
  _mm_store_si128(reinterpret_cast<__m128i*>(r), s0);
  return r[0] + r[1];
}

}  // namespace

double measure_read_bandwidth_gbps(std::size_t bytes, int threads, int repeats) {
  constexpr std::size_t kPage = 4096;
  bytes = std::max<std::size_t>(bytes / (kPage * threads), 1) * kPage * threads;
  char* buf = static_cast<char*>(std::aligned_alloc(kPage, bytes));
  if (!buf) return 0.0;
  const std::size_t part = bytes / threads;
  const bool avx2 = __builtin_cpu_supports("avx2");
#pragma omp parallel num_threads(threads)
  std::memset(buf + omp_get_thread_num() * part, 1, part);  // first touch by the reader

  double best = 0.0;
  volatile std::uint64_t sink = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first pass warms up and is not counted
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const char* p = buf + omp_get_thread_num() * part;
      total += avx2 ? sum_avx2(p, part) : sum_sse2(p, part);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    if (r > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  std::free(buf);
  return best;
}

std::size_t last_level_cache_bytes() {
  long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return llc > 0 ? static_cast<std::size_t>(llc) : std::size_t{64} << 20;
}

}  // namespace pagedattn::bench
