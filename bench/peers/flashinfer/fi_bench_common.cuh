// What the FlashInfer peer benchmarks (fi_decode_bench.cu, fi_mla_bench.cu) share: the CUDA error
// check, the workspaces, the cache dtypes, the rotation of inputs past the L2, event timing and
// medians, and the reading of their command lines. Included by every translation unit of both.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "FATAL: CUDA error '%s' (%d) at %s:%d in: %s\n", cudaGetErrorString(e_), \
              (int)e_, __FILE__, __LINE__, #call);                                             \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)

// Workspaces as the Python wrappers allocate them: 128 MB float (the split-KV partial outputs),
// 8 MB int on the device and its 8 MB pinned host twin, where the plan writes the work lists.
struct Workspace {
  void *fbuf = nullptr, *ibuf = nullptr, *ibuf_h = nullptr;
  size_t fbytes = 128u << 20, ibytes = 8u << 20;
};
// ws's buffers, zeroed.
inline void alloc_workspace(Workspace& ws) {
  CK(cudaMalloc(&ws.fbuf, ws.fbytes));
  CK(cudaMalloc(&ws.ibuf, ws.ibytes));
  CK(cudaMallocHost(&ws.ibuf_h, ws.ibytes));
  CK(cudaMemset(ws.fbuf, 0, ws.fbytes));
  CK(cudaMemset(ws.ibuf, 0, ws.ibytes));
  std::memset(ws.ibuf_h, 0, ws.ibytes);
}
inline void free_workspace(Workspace& ws) {
  CK(cudaFree(ws.fbuf));
  CK(cudaFree(ws.ibuf));
  CK(cudaFreeHost(ws.ibuf_h));
}

// The cache element type (--kv-dtype); q and the output are bf16.
enum class KvDtype { BF16, E4M3, E5M2 };
inline const char* kv_dtype_name(KvDtype t) {
  return t == KvDtype::E4M3 ? "fp8_e4m3" : t == KvDtype::E5M2 ? "fp8_e5m2" : "bf16";
}
inline size_t kv_dtype_bytes(KvDtype t) { return t == KvDtype::BF16 ? 2 : 1; }

// A 64-bit hash of x, for inputs drawn on the device from (seed, index).
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A device copy of h (freed with cudaFree).
template <typename T>
T* upload(const std::vector<T>& h) {
  T* d;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Rotation, as pagedattn-bench does it: enough independent input sets that their caches together
// span at least 4x a 60 MiB L2 (the H200's), at most kMaxSets; one without rotation. A graph of
// kGraphCalls calls runs set i % sets at call i, so one replay runs every set.
constexpr int kMaxSets = 16, kGraphCalls = 20;
static_assert(kMaxSets <= kGraphCalls, "one graph replay must run every set");
inline int rotation_sets(double set_cache_bytes, bool rotate) {
  const double span = 4.0 * 60.0 * (1 << 20);
  return rotate ? (int)std::clamp(std::ceil(span / set_cache_bytes), 1.0, (double)kMaxSets) : 1;
}

// Two CUDA events that time what a stream runs between them.
class EventTimer {
 public:
  EventTimer() {
    CK(cudaEventCreate(&start_));
    CK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    CK(cudaEventDestroy(start_));
    CK(cudaEventDestroy(stop_));
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Milliseconds the work enqueue() puts on stream s takes, waited for.
  template <typename F>
  double ms(cudaStream_t s, F&& enqueue) {
    CK(cudaEventRecord(start_, s));
    enqueue();
    CK(cudaEventRecord(stop_, s));
    CK(cudaEventSynchronize(stop_));
    float ms;
    CK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_, stop_;
};

// Milliseconds of each of `reps` plain calls run(n), after max(10, sets) untimed ones; n counts
// on over both, so the calls go round the sets in turn.
template <typename Run>
std::vector<double> time_plain_calls(EventTimer& timer, cudaStream_t s, int sets, int reps,
                                     Run&& run) {
  int next = 0;
  for (int i = 0; i < std::max(10, sets); ++i) CK(run(next++));
  CK(cudaStreamSynchronize(s));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(timer.ms(s, [&] { CK(run(next++)); }));
  return ms;
}

// The middle sample (the mean of the two middle ones for an even count).
inline double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// The fields of a comma-separated list.
inline std::vector<std::string> split_commas(const char* text) {
  std::vector<std::string> f;
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');) f.push_back(t);
  return f;
}

// The command line, one flag at a time; a flag's value that is missing or not what it takes ends
// the program (exit status 1) with a line naming the flag.
class FlagReader {
 public:
  FlagReader(int argc, char** argv) : argc_(argc), argv_(argv) {}
  // Moves to the next flag; false after the last.
  bool next_flag() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    return true;
  }
  const std::string& flag() const { return flag_; }
  // The flag's value, the next argument.
  std::string value() {
    if (i_ + 1 >= argc_) {
      fprintf(stderr, "missing value for %s\n", flag_.c_str());
      exit(1);
    }
    return argv_[++i_];
  }
  // The flag's value as an integer in [lo, hi].
  int integer(long lo, long hi) {
    const std::string v = value();
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < lo || n > hi) {
      fprintf(stderr, "bad %s '%s': want an integer in [%ld, %ld]\n", flag_.c_str(), v.c_str(), lo,
              hi);
      exit(1);
    }
    return (int)n;
  }
  // What the flag's value names among `choices` (name, meaning); `want` lists them in the line
  // for any other value.
  template <typename T>
  T choice(const std::vector<std::pair<std::string, T>>& choices, const char* want) {
    const std::string v = value();
    for (const auto& [name, meaning] : choices)
      if (name == v) return meaning;
    fprintf(stderr, "bad %s '%s': %s\n", flag_.c_str(), v.c_str(), want);
    exit(1);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
};
