// The split plan: which blocks each work item covers. Both backends execute the same plan:
// every item (sequence, kv head, split) folds its block range into partial softmax states
// (m, l, acc) for the G query heads of its group, then a combine merges the splits of each
// (sequence, query head) and finalizes out and lse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/host_device.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn {

struct WorkItem {
  int seq;
  int kv_head;
  int split;        // index among this sequence's splits
  int block_begin;  // logical blocks [block_begin, block_end) of the sequence (with a window,
                    // from its first block on)
  int block_end;
};

struct PlanOptions {
  int parallelism = 1;         // work items that keep the machine busy (threads, SMs x CTAs)
  int min_chunk_tokens = 256;  // a split never covers fewer tokens (amortizes the combine)
  int max_splits_per_seq = 64;
  bool single_split = false;  // one split per sequence
  // Cut batches of similar lengths into one whole wave of equal items (the CUDA backend):
  // see choose_chunk_blocks.
  bool even_waves = false;
  // DecodeArgs::window_left: a sequence's items cover only the blocks from
  // window_first_block(L) on (see planned_blocks).
  int window_left = -1;
  // Batch-invariant plans (DecodeOptions::batch_invariant) when > 0: every sequence is cut into
  // splits of this many tokens, whatever else is in the batch, its chunk raised only where its
  // own length needs more than max_splits_per_seq of them (seq_chunk_blocks).
  int fixed_chunk_tokens = 0;
};

// The split size in tokens of batch-invariant plans, on both backends: short enough that one
// sequence of a few thousand tokens still spreads over many items, long enough that a large
// batch is not mostly partial states.
constexpr int kBatchInvariantChunkTokens = 512;
// At most this many splits per sequence in a batch-invariant plan: it bounds the workspace, which
// must hold every sequence's splits at the table's capacity (max_plan_splits).
constexpr int kBatchInvariantMaxSplits = 64;

// A batch-invariant plan's options (DecodeOptions::batch_invariant), on both backends: every
// sequence cut into splits of kBatchInvariantChunkTokens, whatever else is in the batch.
inline void make_batch_invariant(PlanOptions& o) {
  o.fixed_chunk_tokens = kBatchInvariantChunkTokens;
  o.max_splits_per_seq = kBatchInvariantMaxSplits;
}

struct SplitPlan {
  int batch = 0;
  int num_kv_heads = 0;
  int block_size = 0;
  // At most this many logical blocks per split (seq_chunk_blocks: a batch-invariant plan gives a
  // sequence too long for max_splits_per_seq of them its own, larger chunk).
  int chunk_blocks = 0;
  std::vector<int> num_splits;    // per sequence; 0 for an empty context
  std::vector<int> split_offset;  // prefix sums of num_splits, batch + 1 entries
  std::vector<WorkItem> items;    // ordered by (seq, kv_head, split)

  int total_splits() const { return split_offset.empty() ? 0 : split_offset.back(); }
  // Index of the partial state of (seq, split, query head) in a partials buffer.
  std::int64_t partial_index(int seq, int split, int head, int num_heads) const {
    return static_cast<std::int64_t>(split_offset[seq] + split) * num_heads + head;
  }
  // Partial states the plan needs (each has m, l and head_dim accumulator floats).
  std::int64_t num_partials(int num_heads) const {
    return static_cast<std::int64_t>(total_splits()) * num_heads;
  }
};

// Plans `batch` sequences of context_lens (host memory, already validated). One chunk size for
// the whole batch, so a long sequence gets many splits and a short one few: a skewed batch does
// not wait on one long split. A sequence's splits are balanced (split_block_range).
SplitPlan make_split_plan(const std::int32_t* context_lens, int batch, int num_kv_heads,
                          int block_size, const PlanOptions& options);

// The chunk size (in blocks) the planner picks for `batch` sequences whose largest context is
// max_blocks and whose total blocks (summed over sequences) is total_blocks. Host and device
// alike: the CUDA backend plans on the device with this same rule.
PAGEDATTN_HOST_DEVICE int choose_chunk_blocks(std::int64_t total_blocks, int max_blocks, int batch,
                                              int num_kv_heads, int block_size,
                                              const PlanOptions& o) {
  if (max_blocks <= 0) return 1;
  if (o.single_split) return max_blocks;
  if (o.fixed_chunk_tokens > 0) return blocks_for(o.fixed_chunk_tokens, block_size);
  // Enough items to fill the machine: kv_heads * total_blocks / chunk ~= parallelism.
  const std::int64_t kv = num_kv_heads > 1 ? num_kv_heads : 1;
  const std::int64_t work = total_blocks * kv;
  const std::int64_t parallel = o.parallelism > 1 ? o.parallelism : 1;
  const std::int64_t min_chunk =
      blocks_for(o.min_chunk_tokens > 1 ? o.min_chunk_tokens : 1, block_size);
  const int max_splits = o.max_splits_per_seq > 1 ? o.max_splits_per_seq : 1;
  const std::int64_t by_splits = (max_blocks + max_splits - 1) / max_splits;
  const std::int64_t seqs = batch > 0 ? batch : 1;
  if (o.even_waves && static_cast<std::int64_t>(max_blocks) * seqs <= 2 * total_blocks) {
    // No sequence longer than twice the mean: k = parallelism / (batch * kv) splits for the
    // longest, so the items fill one wave at most, equal in size, and once batch * kv fills the
    // machine nothing is split (no combine work, one item per (sequence, kv head), as long as
    // possible). The plain rule below rounds 32 x 1024 tokens at 8 kv heads into two waves of
    // 512 half-size items for 264 slots.
    std::int64_t k = parallel / (seqs * kv);
    k = k > 1 ? k : 1;
    std::int64_t chunk = (max_blocks + k - 1) / k;
    chunk = chunk > min_chunk ? chunk : min_chunk;
    chunk = chunk > by_splits ? chunk : by_splits;
    return static_cast<int>(chunk < max_blocks ? chunk : max_blocks);
  }
  // Rounding each sequence's split count up adds up to kv items per sequence. When that slack
  // is small, aim below the target by it, so that a few long sequences fill whole waves of the
  // machine instead of spilling a handful of items into one more (1 x 131072 tokens: 65 splits
  // x 8 kv heads = 520 items, not 67 x 8 = 536 against 528). Many sequences keep the plain rule:
  // their items are small next to a wave, so the spill costs little.
  const std::int64_t slack = static_cast<std::int64_t>(batch > 0 ? batch : 0) * kv;
  const std::int64_t target = slack * 4 <= parallel ? parallel - slack : parallel;
  std::int64_t chunk = (work + target - 1) / target;
  // Not so small that the combine costs more than the split saves.
  chunk = chunk > min_chunk ? chunk : min_chunk;
  // Bounded splits per sequence keep the partials buffer small.
  chunk = chunk > by_splits ? chunk : by_splits;
  return static_cast<int>(chunk < max_blocks ? chunk : max_blocks);
}

// The chunk of a sequence of nb planned blocks under the plan's chunk: the same, except in a
// batch-invariant plan, where a sequence too long for max_splits_per_seq splits of it takes the
// fewest blocks per split that fit (from its own length alone).
PAGEDATTN_HOST_DEVICE int seq_chunk_blocks(int nb, int chunk, const PlanOptions& o) {
  if (o.fixed_chunk_tokens <= 0 || o.single_split) return chunk;
  const int max_splits = o.max_splits_per_seq > 1 ? o.max_splits_per_seq : 1;
  const int need = static_cast<int>((static_cast<std::int64_t>(nb) + max_splits - 1) / max_splits);
  return need > chunk ? need : chunk;
}

// The blocks of a context of `len` tokens with q_len query tokens that the plan covers, from
// logical block *first on: all of them, or with a window those from the block of the earliest
// query's first attended token on (queries_first_token); none without query tokens.
PAGEDATTN_HOST_DEVICE int planned_blocks(int len, int block_size, int window_left, int* first,
                                         int q_len = 1) {
  if (q_len <= 0) {
    *first = 0;
    return 0;
  }
  *first = queries_first_token(len, q_len, window_left) / block_size;
  return blocks_for(len, block_size) - *first;
}

// The splits of a sequence of nb blocks under chunk size `chunk`: ceil(nb / chunk) of them, of
// balanced sizes (floor or ceil of nb / splits, never empty, never above chunk), so that no
// short remainder split becomes an item of its own size class. Split s covers logical blocks
// [*begin, *end).
PAGEDATTN_HOST_DEVICE int splits_for(int nb, int chunk) {
  return nb <= 0 ? 0 : (nb + chunk - 1) / chunk;
}
PAGEDATTN_HOST_DEVICE void split_block_range(int nb, int chunk, int s, int* begin, int* end) {
  const std::int64_t ns = splits_for(nb, chunk);
  *begin = static_cast<int>(s * static_cast<std::int64_t>(nb) / ns);
  *end = static_cast<int>((s + 1) * static_cast<std::int64_t>(nb) / ns);
}

// An upper bound on a plan's total splits for any context lengths of at most
// max_blocks_per_seq blocks each: what a fixed launch grid (the CUDA backend, CUDA graphs) must
// cover. chunk >= kv_heads * total_blocks / parallelism gives
// sum_b ceil(nb_b / chunk) <= parallelism / kv_heads + batch (with even_waves, every sequence
// has at most k <= parallelism / (batch * kv_heads) splits, so the sum is at most
// parallelism / kv_heads), and no sequence has more than
// min(max_splits_per_seq, ceil(max_blocks_per_seq / min_chunk_blocks)) splits.
inline std::int64_t max_plan_splits(int batch, int max_blocks_per_seq, int num_kv_heads,
                                    int block_size, const PlanOptions& o) {
  if (batch <= 0 || max_blocks_per_seq <= 0) return 0;
  const std::int64_t min_chunk =
      blocks_for(o.fixed_chunk_tokens > 0 ? o.fixed_chunk_tokens
                                          : (o.min_chunk_tokens > 1 ? o.min_chunk_tokens : 1),
                 block_size);
  const std::int64_t max_splits = o.max_splits_per_seq > 1 ? o.max_splits_per_seq : 1;
  const std::int64_t by_chunk = (max_blocks_per_seq + min_chunk - 1) / min_chunk;
  const std::int64_t by_seq =
      static_cast<std::int64_t>(batch) * (by_chunk < max_splits ? by_chunk : max_splits);
  if (o.fixed_chunk_tokens > 0) return by_seq;  // the chunk owes nothing to the parallelism
  const std::int64_t kv = num_kv_heads > 1 ? num_kv_heads : 1;
  const std::int64_t parallel = o.parallelism > 1 ? o.parallelism : 1;
  const std::int64_t by_work = (parallel + kv - 1) / kv + batch;
  return by_seq < by_work ? by_seq : by_work;
}

}  // namespace pagedattn
