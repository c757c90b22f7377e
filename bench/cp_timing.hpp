// The measurement behind pagedattn-cp-bench: one decode step of a batch-1 sequence timed on one
// device holding the whole context, then over a group of ranks each holding a contiguous range of
// its blocks (context_parallel_decode), with the error of the group's result against the single
// device's. CPU (host memory, threads of the in-process group) in cp_timing_cpu.cpp; CUDA (one
// thread per GPU over NCCL) in cp_timing.cu, or cp_timing_unavailable.cpp without the CUDA
// backend.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "median.hpp"
#include "pagedattn/context_parallel.hpp"

namespace pagedattn::bench {

struct CpShape {
  int context = 0;  // tokens of the one sequence
  int heads = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  DType dtype = DType::kBF16;
};

struct CpTimingOptions {
  int root = -1;              // ContextParallelOptions::root
  int steps_per_sample = 10;  // steps timed back to back per sample (one CUDA graph on CUDA)
  int samples = 10;           // the median sample is reported
  int cpu_threads = 0;        // CPU: threads in all (each rank gets its share); 0: OpenMP's
};

struct CpRow {
  double single_ms = 0;    // one step, the whole context on one device
  double group_ms = 0;     // one step over the group (the slowest rank)
  double kv_bytes = 0;     // K and V bytes of the whole context
  double state_bytes = 0;  // bytes each rank sends per step
  double rel_err = 0;      // max |group - single| / max |single| over out
  double lse_err = 0;      // max |group lse - single lse|
};

// comms: one communicator per rank over device memory (rank r on GPU comms[r]'s device, the
// caller's order); GPU r is the r-th entry of `devices`.
CpRow time_cuda(const CpShape& shape, const std::vector<Communicator*>& comms,
                const std::vector<int>& devices, const CpTimingOptions& options);
// comms: the in-process group over host memory.
CpRow time_cpu(const CpShape& shape, const std::vector<Communicator*>& comms,
               const CpTimingOptions& options);

// Visible CUDA devices (0 without the CUDA backend).
int cuda_device_count();

// ---- shared by both measurements (cp_common.cpp) ----

// One step's out (in the shape's dtype) and lse, on the host.
struct StepResult {
  std::vector<std::uint8_t> out;
  std::vector<float> lse;
};

// Rank r's share of nb blocks: the contiguous range [first, second).
std::pair<int, int> share_range(int nb, int r, int ranks);
class SpinBarrier;
// Runs body(r) on one thread per rank and waits for them; then rethrows the first rank's error.
// A rank that throws aborts `barrier`, so the others leave it (with an error) instead of waiting.
void on_ranks(int ranks, SpinBarrier& barrier, const std::function<void(int)>& body);
// The DecodeArgs of one share: batch 1 in the shape's dtype over the given buffers (a pool of
// pool_blocks blocks, a table row of table_len entries).
DecodeArgs share_args(const CpShape& shape, int pool_blocks, int table_len, const void* q,
                      const void* k, const void* v, const std::int32_t* table,
                      const std::int32_t* lens, void* out, float* lse);
// context_parallel_state_bytes() of the shape's step.
double state_bytes(const CpShape& shape);
// times[rank][sample] in ms for `steps` steps: the median over samples of the slowest rank, per
// step.
double group_step_ms(const std::vector<std::vector<double>>& times, int steps);
// Sets row.rel_err and row.lse_err of `grouped` against `single`.
void compare_results(CpRow& row, DType dtype, const StepResult& single, const StepResult& grouped);
// What one rank of the group sees in time_group: its share [lo, hi) of the blocks, the options
// its context_parallel_decode takes (root options.root), the barrier the ranks meet at, and its
// samples to fill (options.samples of them, in ms for steps_per_sample steps each).
struct GroupRank {
  int rank = 0, lo = 0, hi = 0;
  bool root = false;  // the rank whose result is the group's
  const ContextParallelOptions& cp;
  SpinBarrier& barrier;
  std::vector<double>& samples;
};
// The group's part of both measurements: runs rank_body on one thread per rank (on_ranks), rank r
// holding blocks [r * nb / ranks, (r + 1) * nb / ranks); sets row.group_ms from the ranks' samples
// (group_step_ms) and returns the root's result (rank_body's return elsewhere is dropped).
StepResult time_group(CpRow& row, const CpTimingOptions& options, int ranks, int nb,
                      const std::function<StepResult(const GroupRank&)>& rank_body);

}  // namespace pagedattn::bench
