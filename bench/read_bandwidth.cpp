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

// Each kernel sums 64-bit words with four independent accumulators (the sum keeps the loads
// alive) over one thread's part of the buffer; the measurement takes the fastest kernel the CPU
// runs, so the figure is the best plain streaming read of the host, not one instruction set's.
// The loads are unaligned ones (as fast on aligned data): a pattern read (time_read_tasks) passes
// cache blocks at whatever alignment their allocation has.
using SumFn = std::uint64_t (*)(const char*, std::size_t);

// 64-byte loads: one cache line each; with kPrefetch, also a software prefetch 2 KB ahead, which
// some hosts stream faster with.
template <bool kPrefetch>
__attribute__((target("avx512f"))) std::uint64_t sum_avx512(const char* p, std::size_t bytes) {
  constexpr std::size_t kAhead = 2048;
  const __m512i* a = reinterpret_cast<const __m512i*>(p);
  const std::size_t n = bytes / 64;
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    const char* line = p + i * 64 + kAhead;
    if (kPrefetch && line + 256 <= p + bytes) {
      _mm_prefetch(line, _MM_HINT_T0);
      _mm_prefetch(line + 64, _MM_HINT_T0);
      _mm_prefetch(line + 128, _MM_HINT_T0);
      _mm_prefetch(line + 192, _MM_HINT_T0);
    }
    s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(a + i));
    s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(a + i + 1));
    s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(a + i + 2));
    s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(a + i + 3));
  }
  return _mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

// The sum of the 64-bit words of [p, p + bytes) in whole groups of four vectors V, each of four
// accumulators taking one; V is a vector of 64-bit words (GCC's vector extension) that may be
// unaligned. Inlined into each kernel below, whose target makes V's loads and adds single
// instructions of its width.
template <typename V>
[[gnu::always_inline]] inline std::uint64_t sum_vectors(const char* p, std::size_t bytes) {
  const V* a = reinterpret_cast<const V*>(p);
  const std::size_t n = bytes / sizeof(V);
  V s0{}, s1{}, s2{}, s3{};
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    s0 += a[i];
    s1 += a[i + 1];
    s2 += a[i + 2];
    s3 += a[i + 3];
  }
  s0 = (s0 + s1) + (s2 + s3);
  std::uint64_t r = 0;
  for (std::size_t w = 0; w < sizeof(V) / sizeof(std::uint64_t); ++w) r += s0[w];
  return r;
}

using Words4 = std::uint64_t __attribute__((vector_size(32), aligned(1), may_alias));
using Words2 = std::uint64_t __attribute__((vector_size(16), aligned(1), may_alias));

// 32-byte loads.
__attribute__((target("avx2"))) std::uint64_t sum_avx2(const char* p, std::size_t bytes) {
  return sum_vectors<Words4>(p, bytes);
}

// 16-byte loads (every x86-64).
std::uint64_t sum_sse2(const char* p, std::size_t bytes) { return sum_vectors<Words2>(p, bytes); }

}  // namespace

double measure_read_bandwidth_gbps(std::size_t bytes, int threads, int repeats, Clock clock) {
  constexpr std::size_t kPage = 4096;
  bytes = std::max<std::size_t>(bytes / (kPage * threads), 1) * kPage * threads;
  char* buf = static_cast<char*>(std::aligned_alloc(kPage, bytes));
  if (!buf) return 0.0;
  const std::size_t part = bytes / threads;
  SumFn kernels[2] = {};
  int num_kernels = 0;
  if (__builtin_cpu_supports("avx512f")) {
    kernels[num_kernels++] = &sum_avx512<false>;
    kernels[num_kernels++] = &sum_avx512<true>;
  } else if (__builtin_cpu_supports("avx2")) {
    kernels[num_kernels++] = &sum_avx2;
  } else {
    kernels[num_kernels++] = &sum_sse2;
  }
#pragma omp parallel num_threads(threads)
  std::memset(buf + omp_get_thread_num() * part, 1, part);  // first touch by the reader

  double best = 0.0;
  volatile std::uint64_t sink = 0;
  for (int k = 0; k < num_kernels; ++k) {
    const SumFn sum = kernels[k];
    for (int r = 0; r < repeats + 1; ++r) {  // the first pass warms up and is not counted
      const double t0 = seconds_now(clock);
      std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
      total += sum(buf + omp_get_thread_num() * part, part);
      const double s = seconds_now(clock) - t0;
      sink = sink + total;
      if (r > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
    }
  }
  std::free(buf);
  return best;
}

double time_read_tasks(const std::vector<ReadTask>& tasks, int threads, Clock clock) {
  const SumFn sum = __builtin_cpu_supports("avx512f") ? &sum_avx512<true>
                    : __builtin_cpu_supports("avx2")  ? &sum_avx2
                                                      : &sum_sse2;
  const long long n = static_cast<long long>(tasks.size());
  std::uint64_t total = 0;
  const double t0 = seconds_now(clock);
#pragma omp parallel for num_threads(threads) schedule(dynamic) reduction(+ : total)
  for (long long i = 0; i < n; ++i) {
    const ReadTask& task = tasks[static_cast<std::size_t>(i)];
    for (std::size_t j = 0; j < task.size(); ++j) {
      // The next range's first 2 KB are requested now, a range ahead: the in-range prefetch of
      // sum_avx512<true> stops at its range's end, and the hardware prefetchers do not follow
      // a jump to another place (decode prefetches the blocks ahead the same way).
      if (j + 1 < task.size()) {
        const ReadRange& next = task[j + 1];
        for (std::size_t at = 0; at < std::min<std::size_t>(2048, next.bytes); at += 64) {
          _mm_prefetch(next.begin + at, _MM_HINT_T0);
        }
      }
      total += sum(task[j].begin, task[j].bytes);
    }
  }
  const double s = seconds_now(clock) - t0;
  static volatile std::uint64_t sink = 0;
  sink = sink + total;
  return s;
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
