// What both measurements of pagedattn-cp-bench share (cp_timing.hpp): the step time from the
// ranks' samples, and the group's error against the single device.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <thread>

#include "cp_barrier.hpp"
#include "cp_timing.hpp"

namespace pagedattn::bench {
namespace {

float element(const std::vector<std::uint8_t>& bytes, DType t, std::size_t i) {
  switch (t) {
    case DType::kF32:
      return reinterpret_cast<const float*>(bytes.data())[i];
    case DType::kF16:
      return to_float(reinterpret_cast<const f16_t*>(bytes.data())[i]);
    case DType::kBF16:
      return to_float(reinterpret_cast<const bf16_t*>(bytes.data())[i]);
  }
  return 0;
}

}  // namespace

DecodeArgs share_args(const CpShape& s, int pool_blocks, int table_len, const void* q,
                      const void* k, const void* v, const std::int32_t* table,
                      const std::int32_t* lens, void* out, float* lse) {
  DecodeArgs a;
  a.batch = 1;
  a.num_heads = s.heads;
  a.num_kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.block_size = s.block_size;
  a.num_blocks = pool_blocks;
  a.max_blocks_per_seq = table_len;
  a.q = q;
  a.k_cache = k;
  a.v_cache = v;
  a.q_dtype = a.k_dtype = a.v_dtype = a.out_dtype = s.dtype;
  a.block_table = table;
  a.context_lens = lens;
  a.out = out;
  a.lse = lse;
  return a;
}

std::pair<int, int> share_range(int nb, int r, int ranks) {
  return {static_cast<int>(static_cast<std::int64_t>(nb) * r / ranks),
          static_cast<int>(static_cast<std::int64_t>(nb) * (r + 1) / ranks)};
}

void on_ranks(int ranks, SpinBarrier& barrier, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(ranks);
  std::atomic<int> first{-1};  // the rank that failed first: its error is the one to report
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
        int none = -1;
        first.compare_exchange_strong(none, r);
        barrier.abort();  // the others leave the barrier instead of waiting for this rank
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first.load() >= 0) std::rethrow_exception(errors[first.load()]);
}

double state_bytes(const CpShape& s) {
  DecodeArgs a;
  a.batch = 1;
  a.num_heads = s.heads;
  a.head_dim = s.head_dim;
  return static_cast<double>(context_parallel_state_bytes(a));
}

double group_step_ms(const std::vector<std::vector<double>>& times, int steps) {
  std::vector<double> slowest(times.empty() ? 0 : times[0].size(), 0.0);
  for (const std::vector<double>& rank : times) {
    for (std::size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], rank[i]);
  }
  return median(slowest) / steps;
}

void compare_results(CpRow& row, DType t, const StepResult& single, const StepResult& grouped) {
  double max_ref = 1e-30, max_diff = 0;
  for (std::size_t i = 0; i < single.out.size() / dtype_size(t); ++i) {
    const float a = element(single.out, t, i), b = element(grouped.out, t, i);
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(a)));
    // A non-finite value on either side counts as an infinite error (std::max drops a NaN).
    max_diff = std::max(max_diff, std::isfinite(a) && std::isfinite(b)
                                      ? static_cast<double>(std::fabs(a - b))
                                      : INFINITY);
  }
  row.rel_err = max_diff / max_ref;
  row.lse_err = 0;
  for (std::size_t h = 0; h < single.lse.size(); ++h) {
    const double d = std::fabs(static_cast<double>(single.lse[h]) - grouped.lse[h]);
    row.lse_err = std::max(row.lse_err, std::isfinite(d) ? d : INFINITY);
  }
}

StepResult time_group(CpRow& row, const CpTimingOptions& o, int ranks, int nb,
                      const std::function<StepResult(const GroupRank&)>& rank_body) {
  const int root = o.root < 0 ? 0 : o.root;
  std::vector<std::vector<double>> times(ranks, std::vector<double>(o.samples));
  StepResult grouped;
  SpinBarrier barrier(ranks);
  ContextParallelOptions cp;
  cp.root = o.root;
  on_ranks(ranks, barrier, [&](int r) {
    const auto [lo, hi] = share_range(nb, r, ranks);
    StepResult result = rank_body(GroupRank{r, lo, hi, r == root, cp, barrier, times[r]});
    if (r == root) grouped = std::move(result);
  });
  row.group_ms = group_step_ms(times, o.steps_per_sample);
  return grouped;
}

}  // namespace pagedattn::bench
