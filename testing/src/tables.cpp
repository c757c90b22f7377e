#include "pagedattn/testing/tables.hpp"

#include <algorithm>
#include <numeric>

#include "pagedattn/cache_layout.hpp"

namespace pagedattn::testing {

std::vector<std::int32_t> block_pool(int num_blocks, bool shuffled, std::mt19937_64& rng) {
  std::vector<std::int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  if (shuffled) std::shuffle(pool.begin(), pool.end(), rng);
  return pool;
}

std::vector<std::int32_t> table_from_pool(const std::vector<std::int32_t>& pool,
                                          const std::vector<std::int32_t>& lens, int block_size,
                                          int stride) {
  std::vector<std::int32_t> table(lens.size() * static_cast<std::size_t>(stride), -1);
  auto next = pool.begin();
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const int used = blocks_for(lens[b], block_size);
    std::copy(next, next + used, table.begin() + b * stride);
    next += used;
  }
  return table;
}

std::vector<char> readable_slots(const DecodeArgs& a) {
  const int BS = a.block_size;
  std::vector<char> readable(static_cast<std::size_t>(a.num_blocks) * BS, 0);
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  for (int b = 0; b < a.batch; ++b) {
    for (int t = 0; t < a.context_lens[b]; ++t) {
      readable[static_cast<std::size_t>(table.block(b, t / BS)) * BS + t % BS] = 1;
    }
  }
  return readable;
}

}  // namespace pagedattn::testing
