#include "sim/machine.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <vector>

namespace pagedattn::sim {

double available_ram_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024.0;
    meminfo.ignore(64, '\n');
  }
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double cpu_read_ceiling_gbps(int threads) {
  constexpr std::size_t kBytes = std::size_t(256) << 20;  // well past any last-level cache
  const std::size_t words = kBytes / sizeof(std::uint64_t);
  std::vector<std::uint64_t> buf(words);
  const int n = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for num_threads(n) schedule(static)
  for (std::size_t i = 0; i < words; ++i) buf[i] = i;  // first touch by the reading threads
  double best = 0;
  std::uint64_t keep = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t sum = 0;
#pragma omp parallel for num_threads(n) schedule(static) reduction(+ : sum)
    for (std::size_t i = 0; i < words; i += 8) {  // eight independent adds per line
      sum += (buf[i] + buf[i + 1]) + (buf[i + 2] + buf[i + 3]) + (buf[i + 4] + buf[i + 5]) +
             (buf[i + 6] + buf[i + 7]);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    keep += sum;
    best = std::max(best, kBytes / s / 1e9);
  }
  return keep == 1 ? 0 : best;  // the sum keeps the loads alive
}

CachePlan plan_cache(const Options& o, bool device) {
  CachePlan p;
  if (o.num_blocks > 0) {
    p.num_blocks = o.num_blocks;
    p.budget_source = "--blocks";
    return p;
  }
  std::ostringstream why;
  if (o.cache_mib > 0) {
    p.budget_bytes = o.cache_mib * 1048576.0;
    why << "--cache-mib";
  } else if (device) {
    p.budget_bytes = kDeviceMemoryShare * device_free_bytes();
    why << kDeviceMemoryShare * 100 << "% of free device memory";
  } else {
    const double share = kCpuMemoryShare * available_ram_bytes();
    p.budget_bytes = std::min(share, kCpuCacheCapBytes);
    why << kCpuMemoryShare * 100 << "% of available RAM"
        << (share > kCpuCacheCapBytes ? ", capped" : "");
  }
  p.budget_source = why.str();
  const Model& m = o.model;
  const double block_bytes = static_cast<double>(m.rows_per_token()) * m.row_elements() *
                             o.block_size * static_cast<double>(dtype_size(o.dtype)) * m.layers;
  const double fit = std::min(p.budget_bytes / block_bytes, 1e9);
  const long long per_request = (longest_request(o) + o.block_size - 1) / o.block_size;
  const long long floor = per_request + system_prompt_blocks(o);
  p.num_blocks = static_cast<int>(std::max<double>(fit, static_cast<double>(floor)));
  p.raised = fit < static_cast<double>(floor);
  return p;
}

}  // namespace pagedattn::sim
