// What the simulator sizes itself by: the memory free for the cache and the read ceiling of the
// memory it lives in, measured in the same run.
#pragma once

#include <cstddef>
#include <string>

#include "sim/options.hpp"

namespace pagedattn::sim {

// The cache's share of free memory, without --cache-mib: a quarter of the available RAM on the
// CPU (capped so a default run stays short), half of the free device memory on CUDA.
inline constexpr double kCpuMemoryShare = 0.25;
inline constexpr double kCpuCacheCapBytes = 1024.0 * 1048576.0;
inline constexpr double kDeviceMemoryShare = 0.5;
// Layers simulated without --sim-layers; the rest of the model is extrapolated (report.hpp).
inline constexpr int kCpuSimLayers = 2;
inline constexpr int kDeviceSimLayers = 8;

// How big the cache is and why.
struct CachePlan {
  double budget_bytes = 0;  // the whole model's cache (every layer), 0 with --blocks
  std::string budget_source;
  int num_blocks = 0;   // per layer
  bool raised = false;  // the budget held fewer blocks than the longest request needs
};

// Blocks per layer: --blocks, or the budget over the whole model's bytes per block, raised to
// hold the longest request beside the system prompts.
CachePlan plan_cache(const Options& o, bool device);

// Bytes of RAM available to new allocations (MemAvailable), or the physical RAM.
double available_ram_bytes();
// The best streaming read of the host over a buffer far larger than the caches, in GB/s.
double cpu_read_ceiling_gbps(int threads);

// Built from device_info.cu with the CUDA backend, device_info_none.cpp without (where both
// throw kBackendUnavailable).
double device_free_bytes();
double device_read_ceiling_gbps();

}  // namespace pagedattn::sim
