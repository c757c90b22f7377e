// pagedattn-cp-bench on the CPU (cp_timing.hpp): the same steps over host memory and the
// in-process group, the ranks as threads sharing the machine's cores. It shows the protocol at
// work and what it costs; the speed-up it reports is bounded by the one memory system all ranks
// share.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cp_barrier.hpp"
#include "cp_timing.hpp"
#include "pagedattn/cache_layout.hpp"

namespace pagedattn::bench {
namespace {

constexpr int kSpareBlocks = 7;

using Clock = std::chrono::steady_clock;

void store(std::vector<std::uint8_t>& bytes, DType t, std::size_t i, float x) {
  switch (t) {
    case DType::kF32:
      reinterpret_cast<float*>(bytes.data())[i] = x;
      break;
    case DType::kF16:
      reinterpret_cast<f16_t*>(bytes.data())[i] = from_float<f16_t>(x);
      break;
    case DType::kBF16:
      reinterpret_cast<bf16_t*>(bytes.data())[i] = from_float<bf16_t>(x);
      break;
  }
}

// One share: blocks [lo, hi) of the logical K and V, copied into a pool of their own in random
// order.
struct Share {
  std::vector<std::uint8_t> k, v, out;
  std::vector<std::int32_t> table;
  std::int32_t len = 0;
  std::vector<float> lse;
  DecodeArgs args;

  Share(const CpShape& s, const std::vector<std::uint8_t>& q, const std::vector<std::uint8_t>& lk,
        const std::vector<std::uint8_t>& lv, int lo, int hi, std::uint64_t order_seed) {
    const int nb = hi - lo, pool_blocks = nb + kSpareBlocks;
    const std::size_t block_bytes =
        static_cast<std::size_t>(s.kv_heads) * s.block_size * s.head_dim * dtype_size(s.dtype);
    std::vector<std::int32_t> perm(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937_64 rng(order_seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    k.assign(block_bytes * pool_blocks, 0);
    v.assign(block_bytes * pool_blocks, 0);
    table.assign(std::max(nb, 1), -1);
    for (int i = 0; i < nb; ++i) {
      table[i] = perm[i];
      std::memcpy(&k[perm[i] * block_bytes], &lk[(lo + i) * block_bytes], block_bytes);
      std::memcpy(&v[perm[i] * block_bytes], &lv[(lo + i) * block_bytes], block_bytes);
    }
    len = std::max(0, std::min(hi * s.block_size, s.context) - lo * s.block_size);
    out.assign(q.size(), 0);
    lse.assign(s.heads, 0.f);
    args = share_args(s, pool_blocks, static_cast<int>(table.size()), q.data(), k.data(), v.data(),
                      table.data(), &len, out.data(), lse.data());
  }
};

template <typename F>
double time_ms(int steps, F step) {
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

CpRow time_cpu(const CpShape& s, const std::vector<Communicator*>& comms,
               const CpTimingOptions& o) {
  const int ranks = static_cast<int>(comms.size());
  const int nb = blocks_for(s.context, s.block_size);
  const int K = o.steps_per_sample;
  const int threads = o.cpu_threads > 0 ? o.cpu_threads : omp_get_max_threads();
  CpRow row;
  row.kv_bytes = 2.0 * s.context * s.kv_heads * s.head_dim * dtype_size(s.dtype);
  row.state_bytes = state_bytes(s);

  // The logical K and V (block after block) and q, N(0, 1).
  const std::size_t block_elems = static_cast<std::size_t>(s.kv_heads) * s.block_size * s.head_dim;
  std::vector<std::uint8_t> q(static_cast<std::size_t>(s.heads) * s.head_dim * dtype_size(s.dtype));
  std::vector<std::uint8_t> lk(block_elems * nb * dtype_size(s.dtype)), lv(lk.size());
  std::mt19937_64 rng(20261130);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < q.size() / dtype_size(s.dtype); ++i)
    store(q, s.dtype, i, normal(rng));
  for (std::size_t i = 0; i < block_elems * nb; ++i) {
    store(lk, s.dtype, i, normal(rng));
    store(lv, s.dtype, i, normal(rng));
  }

  Share single(s, q, lk, lv, 0, nb, 1);
  DecodeOptions opt;
  opt.backend = Backend::kCpu;
  opt.num_threads = threads;
  decode(single.args, opt);  // warm-up
  std::vector<double> samples;
  for (int i = 0; i < o.samples; ++i) {
    samples.push_back(time_ms(K, [&] { decode(single.args, opt); }));
  }
  row.single_ms = median(samples) / K;

  const StepResult grouped = time_group(row, o, ranks, nb, [&](const GroupRank& g) {
    Share sh(s, q, lk, lv, g.lo, g.hi, 100 + g.rank);
    DecodeOptions ro;
    ro.backend = Backend::kCpu;
    ro.num_threads = std::max(1, threads / ranks);
    auto step = [&] { context_parallel_decode(sh.args, *comms[g.rank], ro, g.cp); };
    step();  // warm-up
    for (int i = 0; i < o.samples; ++i) {
      g.barrier.wait();
      g.samples[i] = time_ms(K, step);
    }
    return g.root ? StepResult{sh.out, sh.lse} : StepResult{};
  });
  compare_results(row, s.dtype, StepResult{single.out, single.lse}, grouped);
  return row;
}

}  // namespace pagedattn::bench
