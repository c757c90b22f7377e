#include "pagedattn/split_plan.hpp"

#include <algorithm>

#include "pagedattn/cache_layout.hpp"

namespace pagedattn {

SplitPlan make_split_plan(const std::int32_t* context_lens, int batch, int num_kv_heads,
                          int block_size, const PlanOptions& options) {
  SplitPlan plan;
  plan.batch = batch;
  plan.num_kv_heads = num_kv_heads;
  plan.block_size = block_size;
  std::int64_t total_blocks = 0;
  int max_blocks = 0;
  int first = 0;
  for (int b = 0; b < batch; ++b) {
    const int nb = planned_blocks(context_lens[b], block_size, options.window_left, &first);
    total_blocks += nb;
    max_blocks = std::max(max_blocks, nb);
  }
  plan.chunk_blocks =
      choose_chunk_blocks(total_blocks, max_blocks, batch, num_kv_heads, block_size, options);
  plan.num_splits.resize(batch);
  plan.split_offset.assign(batch + 1, 0);
  for (int b = 0; b < batch; ++b) {
    const int nb = planned_blocks(context_lens[b], block_size, options.window_left, &first);
    plan.num_splits[b] = splits_for(nb, seq_chunk_blocks(nb, plan.chunk_blocks, options));
    plan.split_offset[b + 1] = plan.split_offset[b] + plan.num_splits[b];
  }
  plan.items.reserve(static_cast<std::size_t>(plan.total_splits()) * num_kv_heads);
  for (int b = 0; b < batch; ++b) {
    const int nb = planned_blocks(context_lens[b], block_size, options.window_left, &first);
    const int chunk = seq_chunk_blocks(nb, plan.chunk_blocks, options);
    for (int kv = 0; kv < num_kv_heads; ++kv) {
      for (int s = 0; s < plan.num_splits[b]; ++s) {
        int begin = 0, end = 0;
        split_block_range(nb, chunk, s, &begin, &end);
        plan.items.push_back({b, kv, s, first + begin, first + end});
      }
    }
  }
  return plan;
}

}  // namespace pagedattn
