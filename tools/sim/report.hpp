// What pagedattn-sim prints: the setup before the run, a progress bar on stderr during it, and
// the summary after it (docs/simulator.md explains each line).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "sim/machine.hpp"
#include "sim/options.hpp"

namespace pagedattn::sim {

// One simulated layer's attention: its time and K/V bytes over the run, and how many layers of
// the model it stands for (the model's layers of its kind over the sampled ones of that kind).
struct LayerTiming {
  int layer = 0;
  int window_left = -1;
  double seconds = 0, bytes = 0;
  double distinct_bytes =
      0;  // of `bytes`, those of distinct (block, slot) pairs (shared_blocks.hpp)
  // of `bytes`, those a decode reads that reads each group's shared prefix once
  // (find_shared_prefixes, shared_prefix.hpp)
  double shared_bytes = 0;
  double weight = 1;
};

struct RunStats {
  Backend backend = Backend::kCpu;
  CachePlan plan;
  double allocated_bytes = 0;  // the simulated layers' K and V
  double huge_pct = -1;        // share of those host bytes on huge pages (< 0: device memory)
  double ceiling_gbps = 0;     // the read ceiling measured before the run
  std::vector<LayerTiming> layers;
  long long steps = 0, generated = 0, prompt_tokens = 0, system_tokens = 0;
  long long forks = 0, n_way_forks = 0, cow_copies = 0, preemptions = 0;
  // Blocks that two or more sequences read (whole contexts), summed over the steps.
  long long shared_block_reads = 0;
  double wall_seconds = 0;
  double naive_seconds = 0;  // the naive decode's time over the simulated layers (--compare)
  int peak_used = 0, peak_running = 0;
  std::vector<float> occupancy, fragmentation;  // per step
  int verified = 0, mismatches = 0;
  long long verified_seqs = 0;  // sequences recomputed over the checked steps
  double worst_rel = 0, worst_lse = 0;
  bool all_free = true;
};

// Weights each sampled layer by the model's layers of its kind (sliding or full) it stands for.
void weigh_layers(const Model& model, std::vector<LayerTiming>& layers);

void print_setup(const Options& o, const RunStats& s);
void print_summary(const Options& o, const RunStats& s);

class Progress {
 public:
  Progress(bool on, int total) : on_(on), total_(total), start_(std::chrono::steady_clock::now()) {}
  void update(int done, long long steps, bool force = false);
  void finish(int done, long long steps);

 private:
  using Clock = std::chrono::steady_clock;
  bool on_;
  int total_;
  Clock::time_point start_;
  double last_ = -1;
};

}  // namespace pagedattn::sim
