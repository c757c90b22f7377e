// Planning on the device: every CTA derives the core's chunk rule (core/split_plan.hpp) from the
// context lengths and finds which (sequence, split) its global split index belongs to, so a grid
// sized from shapes alone serves any lengths (CUDA-graph replay with new lengths). CTA 0 also
// publishes the split offsets for the combine.
#pragma once

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/variants.hpp"
#include "ptx.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

__device__ __forceinline__ int clamp_len(int len, int cap) {
  return len < 0 ? 0 : (len > cap ? cap : len);
}

// blocks_for(len, block_size) through the launch's FastDiv (no integer division).
__device__ __forceinline__ int blocks_of(const SplitParams& p, int len) {
  const int q = static_cast<int>(p.block_div.div(static_cast<unsigned>(len)));
  return q + (len != q * p.block_size);
}

// The blocks a context of `len` tokens with n_q query tokens has in the plan, from logical block
// *first on (planned_blocks of core/split_plan.hpp, through the FastDiv).
__device__ __forceinline__ int planned_of(const SplitParams& p, int len, int n_q, int* first) {
  if (n_q <= 0) {
    *first = 0;
    return 0;
  }
  *first = static_cast<int>(
      p.block_div.div(static_cast<unsigned>(queries_first_token(len, n_q, p.plan.window_left))));
  return blocks_of(p, len) - *first;
}

// Sequence b's planned blocks (its length clamped to the table's capacity).
__device__ __forceinline__ int planned_of_seq(const SplitParams& p, int b, int* first) {
  const int len = clamp_len(__ldg(p.lens + b), p.max_blocks * p.block_size);
  return planned_of(p, len, seq_queries(p, b).n, first);
}

struct ItemInfo {
  int seq, split, chunk, offset, found;
};

// The shared memory the planner of a CTA of kPlanThreads threads works in: the kernel places it
// (a static shared variable, or a member of the kernel's shared storage).
template <int kPlanThreads>
struct PlanScratch {
  static constexpr int kPlanWarps = kPlanThreads / 32;
  long long red_l[kPlanWarps];
  int red_max[kPlanWarps];
  int red_i[kPlanWarps];
  ItemInfo item;
};

// Finds work item j of the plan; every one of the CTA's kPlanThreads threads takes part.
template <int kPlanThreads>
__device__ inline void plan_item(const SplitParams& p, int j, PlanScratch<kPlanThreads>& sh) {
  constexpr int kPlanWarps = kPlanThreads / 32;
  long long* red_l = sh.red_l;
  int* red_max = sh.red_max;
  int* red_i = sh.red_i;
  ItemInfo* item = &sh.item;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  long long sum = 0;
  int mx = 0, first = 0;
  for (int b = tid; b < p.batch; b += kPlanThreads) {
    const int nb = planned_of_seq(p, b, &first);
    sum += nb;
    mx = max(mx, nb);
  }
  sum = warp_sum(sum);
  mx = warp_max(mx);
  if (lane == 0) {
    red_l[warp] = sum;
    red_max[warp] = mx;
  }
  __syncthreads();
  // Every thread derives the chunk itself: no second barrier waiting on one thread's divisions,
  // a wait every CTA would pay.
  long long total_blocks = 0;
  int max_blocks = 0;
#pragma unroll
  for (int w = 0; w < kPlanWarps; ++w) {
    total_blocks += red_l[w];
    max_blocks = max(max_blocks, red_max[w]);
  }
  const int chunk =
      choose_chunk_blocks(total_blocks, max_blocks, p.batch, p.num_kv_heads, p.block_size, p.plan);
  if (tid == 0) {
    item->chunk = chunk;
    item->found = 0;  // set before the scan's first barrier, found = 1 only after it
  }
  int running = 0;
  for (int base = 0; base < p.batch; base += kPlanThreads) {
    const int b = base + tid;
    int ns = 0;
    if (b < p.batch) {
      const int nb = planned_of_seq(p, b, &first);
      ns = splits_for(nb, seq_chunk_blocks(nb, chunk, p.plan));
    }
    int incl = ns;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) red_i[warp] = incl;
    __syncthreads();
    int before = running, total = running;
    for (int w = 0; w < kPlanWarps; ++w) {
      if (w < warp) before += red_i[w];
      total += red_i[w];
    }
    incl += before;
    const int excl = incl - ns;
    if (b < p.batch) {
      if (blockIdx.x == 0) p.split_offset[b] = excl;
      if (j >= excl && j < incl) {
        item->seq = b;
        item->split = j - excl;
        item->offset = excl;
        item->found = 1;
      }
    }
    running = total;
    __syncthreads();
  }
  if (blockIdx.x == 0 && tid == 0) p.split_offset[p.batch] = running;
  __syncthreads();
}

// What one CTA of the split grid decodes: its item (sequence, kv head, rows, split) and the
// tokens of it, [tok_begin, tok_end), of which those from tok_lo on are attended by some query.
struct CtaWork {
  CtaItem item;
  int len;  // the sequence's context length, clamped to the table's capacity
  int tok_begin, tok_lo, tok_end;
};

// CTA blockIdx.x's work, derived on the device from the plan (grid order: row chunk fastest,
// then kv head, then the plan's items). Returns false, uniformly across the CTA, when the CTA
// has none: past the plan's items, or a row chunk past its sequence's query tokens.
template <int kPlanThreads>
__device__ inline bool plan_cta(const SplitParams& p, PlanScratch<kPlanThreads>& sh, CtaWork* w) {
  const ItemInfo& plan = sh.item;
  const int i = blockIdx.x;
  CtaItem& item = w->item;
  const int row_chunk = i % p.row_chunks;
  item.kv = (i / p.row_chunks) % p.num_kv_heads;
  plan_item<kPlanThreads>(p, i / (p.row_chunks * p.num_kv_heads), sh);
  if (!plan.found) return false;
  item.seq = plan.seq;
  const SeqQueries sq = seq_queries(p, item.seq);
  item.q_row0 = sq.row0;
  item.n_q = sq.n;
  item.row_begin = row_chunk * p.rows_per_cta;
  item.rows = min(p.rows_per_cta, sq.n * p.group - item.row_begin);
  if (item.rows <= 0) return false;
  item.part_base = static_cast<std::int64_t>(plan.offset + plan.split) * p.max_q * p.num_heads;
  w->len = clamp_len(__ldg(p.lens + item.seq), p.max_blocks * p.block_size);
  int first = 0;  // with a window, the blocks before it are not planned
  const int nb = planned_of(p, w->len, sq.n, &first);
  const int chunk = seq_chunk_blocks(nb, plan.chunk, p.plan);
  item.finish = splits_for(nb, chunk) == 1;
  int blk_begin = 0, blk_end = 0;
  split_block_range(nb, chunk, plan.split, &blk_begin, &blk_end);
  w->tok_begin = (blk_begin + first) * p.block_size;
  w->tok_lo = queries_first_token(w->len, sq.n, p.plan.window_left);
  w->tok_end = min((blk_end + first) * p.block_size, w->len);
  return true;
}
}  // namespace pagedattn::detail::cuda
