// The bound the CUDA backend sizes its launch grid and workspace with (max_plan_splits in
// core/split_plan.hpp) holds for every context-length pattern: a plan never has more splits
// than the grid covers, whatever lengths a CUDA-graph replay brings. Host only: runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/split_plan.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

void expect_bounded(const std::vector<std::int32_t>& lens, int max_blocks, int kv, int bs,
                    const PlanOptions& o) {
  const int batch = static_cast<int>(lens.size());
  const SplitPlan plan = make_split_plan(lens.data(), batch, kv, bs, o);
  const std::int64_t bound = max_plan_splits(batch, max_blocks, kv, bs, o);
  ASSERT_LE(plan.total_splits(), bound)
      << "batch " << batch << " kv " << kv << " bs " << bs << " max_blocks " << max_blocks
      << " parallelism " << o.parallelism << " min_chunk " << o.min_chunk_tokens << " max_splits "
      << o.max_splits_per_seq;
}

TEST(CudaPlanBound, CoversEveryPlan) {
  std::mt19937_64 rng(testing::seed_for(41));
  for (int trial = 0; trial < 3000; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 70);
    const int kv = 1 + static_cast<int>(rng() % 16);
    const int bs = 1 + static_cast<int>(rng() % 64);
    const int max_blocks = static_cast<int>(rng() % 300);
    PlanOptions o;
    o.parallelism = 1 + static_cast<int>(rng() % 2000);
    o.min_chunk_tokens = 1 + static_cast<int>(rng() % 600);
    o.max_splits_per_seq = 1 + static_cast<int>(rng() % 200);
    o.even_waves = rng() % 2 == 0;
    const int cap = max_blocks * bs;
    std::vector<std::int32_t> lens(batch);
    const int pattern = static_cast<int>(rng() % 4);
    for (int b = 0; b < batch; ++b) {
      switch (pattern) {
        case 0:  // uniform random
          lens[b] = cap ? static_cast<int>(rng() % (cap + 1)) : 0;
          break;
        case 1:  // all full
          lens[b] = cap;
          break;
        case 2:  // skewed: one full, the rest short
          lens[b] = b == 0 ? cap : std::min(cap, static_cast<int>(rng() % (2 * bs + 1)));
          break;
        default:  // one block plus one token: the worst rounding of ceil(nb / chunk)
          lens[b] = std::min(cap, bs + 1);
          break;
      }
    }
    expect_bounded(lens, max_blocks, kv, bs, o);
  }
}

// The CUDA backend's own options on an H200-sized machine, skewed batches included.
TEST(CudaPlanBound, CudaOptions) {
  PlanOptions o;
  o.min_chunk_tokens = 128;
  o.max_splits_per_seq = 1024;
  o.even_waves = true;
  for (int items_per_sm : {2, 4, 12}) {
    o.parallelism = 132 * items_per_sm;
    std::vector<std::int32_t> skew(64, 1024);
    skew[17] = 131072;
    expect_bounded(skew, 131072 / 16, 8, 16, o);
    expect_bounded(std::vector<std::int32_t>(1, 131072), 131072 / 16, 8, 16, o);
    expect_bounded(std::vector<std::int32_t>(128, 4096), 4096 / 16, 8, 16, o);
    expect_bounded(std::vector<std::int32_t>(32, 4096), 4096, 32, 1, o);
    expect_bounded(std::vector<std::int32_t>(32, 1024), 1024 / 16, 8, 16, o);
    expect_bounded(std::vector<std::int32_t>(8, 32768), 32768 / 16, 8, 16, o);
    o.single_split = true;
    expect_bounded(std::vector<std::int32_t>(7, 5000), 5000, 1, 1, o);
    o.single_split = false;
  }
}

}  // namespace
}  // namespace pagedattn
