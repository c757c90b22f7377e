#include "draw_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "draw_parts.hpp"
#include "pagedattn/cache_layout.hpp"
#include "rng.hpp"

namespace pagedattn::fuzz {
namespace {

int draw_context(Rng& r, int bs, bool long_tail) {
  switch (r.uniform(0, 8)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return std::max(bs - 1, 1);
    case 3:
      return bs;
    case 4:
      return bs + 1;
    case 5:
      return r.uniform(2, 4) * bs + r.uniform(-1, 1);
    case 6:
      return r.uniform(1, 4 * bs);
    default: {
      // Long tail: log-uniform up to a few thousand tokens.
      const double top = long_tail ? std::log(3000.0) : std::log(300.0);
      return static_cast<int>(std::exp(r.real() * top));
    }
  }
}

// Cache elements (per K or V tensor) the case allocates: used blocks plus spare ones.
std::int64_t pool_elements(const testing::CaseSpec& s) {
  std::int64_t blocks = s.spare_blocks;
  for (int i = 0; i < s.batch && i < static_cast<int>(s.context_lens.size()); ++i) {
    blocks += blocks_for(s.context_lens[i], s.block_size);
  }
  return blocks * s.num_kv_heads * s.block_size * s.head_dim;
}

void fit_budget(testing::CaseSpec& s, std::int64_t budget) {
  // Query/output rows: bounded too, by trimming the batch.
  while (s.batch > 1 &&
         static_cast<std::int64_t>(s.batch) * s.num_heads * s.head_dim > (std::int64_t{1} << 18)) {
    --s.batch;
  }
  s.context_lens.resize(s.batch);
  // A single block of every kv head must fit a few times over, or every context would vanish.
  const std::int64_t per_block =
      static_cast<std::int64_t>(s.num_kv_heads) * s.block_size * s.head_dim;
  budget = std::max(budget, 4 * per_block);
  // Over budget: trim spare blocks, then long batches, then the longest context (boundary-valued
  // short contexts survive the halving).
  while (pool_elements(s) > budget) {
    if (s.spare_blocks * per_block > budget / 4) {
      s.spare_blocks /= 2;
      continue;
    }
    if (s.batch > 8) {
      s.context_lens.resize(--s.batch);
      continue;
    }
    auto it = std::max_element(s.context_lens.begin(), s.context_lens.end());
    if (it == s.context_lens.end() || *it == 0) break;
    *it /= 2;
  }
}

// Group size from 1 to all heads on one kv head.
int draw_group(Rng& r) {
  const double gu = r.real();
  if (gu < 0.25) return 1;
  if (gu < 0.55) {
    static const int kPow2[] = {2, 4, 8};
    return r.pick(kPow2);
  }
  if (gu < 0.75) {
    static const int kOdd[] = {3, 5, 6, 7};
    return r.pick(kOdd);
  }
  if (gu < 0.92) return r.uniform(1, kMaxGroupSize);
  static const int kLarge[] = {16, 32, kMaxGroupSize};
  return r.pick(kLarge);
}

// The head dim, the block size and the heads: kv heads few enough that a block of every kv head
// stays small.
void draw_heads(testing::CaseSpec& s, Rng& r) {
  s.head_dim = r.pick(kSupportedHeadDims);
  static const int kBlockSizes[] = {1,  2,  3,  5,  7,   8,   13,  15,  16,  17,  31,
                                    32, 33, 63, 64, 100, 127, 128, 129, 200, 255, 256};
  s.block_size = r.chance(0.7) ? r.pick(kBlockSizes) : r.uniform(1, kMaxBlockSize);
  const int group = draw_group(r);
  static const int kKvHeads[] = {1, 1, 2, 2, 3, 4, 8};
  int kv = r.pick(kKvHeads);
  while (kv > 1 && kv * s.block_size * s.head_dim > (1 << 17)) --kv;
  s.num_kv_heads = kv;
  s.num_heads = kv * group;
}

// The batch and its contexts; with `long_ctx` the long tail reaches further and one context is
// long enough for the planner to split it (splits cover >= 256 tokens).
void draw_contexts(testing::CaseSpec& s, Rng& r, bool long_ctx) {
  const double bu = r.real();
  s.batch = bu < 0.03  ? 0
            : bu < 0.5 ? r.uniform(1, 4)
            : bu < 0.8 ? r.uniform(5, 16)
                       : r.uniform(17, 64);
  s.context_lens.resize(s.batch);
  for (int& L : s.context_lens) L = draw_context(r, s.block_size, long_ctx);
  if (long_ctx && s.batch > 0) s.context_lens[r.uniform(0, s.batch - 1)] = r.uniform(300, 1500);
}

// The pool and the tables around the contexts, and the dtypes.
void draw_tables_and_dtypes(testing::CaseSpec& s, Rng& r) {
  s.spare_blocks = r.chance(0.8) ? r.uniform(0, 6) : r.uniform(7, 40);
  s.table_padding = r.chance(0.5) ? 0 : r.uniform(1, 4);
  s.table_stride_extra = r.chance(0.4) ? r.uniform(1, 5) : 0;
  s.fragmented = r.chance(0.85);
  s.share_prefix = r.chance(0.35);
  s.poison = r.chance(0.95);
  s.q_dtype = r.pick(kPlainDTypes);
  s.kv_dtype = r.pick(kPlainDTypes);
  s.out_dtype = r.pick(kPlainDTypes);
}

// The values' magnitude (huge logits for some), exact logits, a custom scale, the CPU threads.
void draw_values(FuzzCase& c, Rng& r) {
  testing::CaseSpec& s = c.spec;
  const bool huge = r.chance(0.15);
  if (huge) {
    static const float kHuge[] = {5.f, 15.f, 50.f};  // logits ~ magnitude^2, up to ~1e4
    s.magnitude = r.pick(kHuge);
  } else {
    static const float kNormal[] = {0.25f, 1.f, 1.f, 2.f};
    s.magnitude = r.pick(kNormal);
  }
  c.snap = r.chance(huge ? 0.5 : 0.1);
  if (c.snap) {
    c.scale = std::ldexp(1.f, -static_cast<int>(std::lround(std::log2(std::sqrt(s.head_dim)))));
  } else if (r.chance(0.1)) {
    c.scale = static_cast<float>(0.01 + 0.5 * r.real());
  }
  static const int kThreads[] = {1, 1, 2, 2, 3, 4};
  c.threads = r.pick(kThreads);
}

// The streams of the parts draw_parts.hpp draws, kept for the malformations that need a part
// the case was drawn without.
struct PartStreams {
  Rng queries, variants, fp8, trees, token_scales;
  std::int64_t work_budget;
};

// Makes a case fit a tree-mask malformation: multi-token queries with a tree mask (from their own
// generators), and a sequence of 2 query tokens or more for a bit above the diagonal (one or more
// for a short span).
void fit_tree_malformation(FuzzCase& c, Malformation m, PartStreams& streams) {
  if (!c.multi_token()) draw_query_lens(c, streams.queries, streams.work_budget, true);
  if (!c.tree) draw_tree_masks(c, streams.trees, true);
  const int need = m == Malformation::kTreeBitAboveDiagonal ? 2
                   : m == Malformation::kTreeSpanShort      ? 1
                                                            : 0;
  if (std::none_of(c.q_lens.begin(), c.q_lens.end(), [&](int n) { return n >= need; })) {
    c.q_lens[0] = need;
    c.max_q_len = std::max(c.max_q_len, need);
    fit_tree_masks(c);
  }
}

// Makes a case fit a per-token scale malformation: per-token scales on a plain cache need a plain
// one; a bad scale or bad strides need per-token scales (and a quantized cache to hold them).
void fit_token_scale_malformation(FuzzCase& c, Malformation m, PartStreams& streams) {
  if (m == Malformation::kTokenScalesOnPlainCache && c.quantized()) {
    drop_quantized(c, streams.fp8.pick(kPlainDTypes));
  }
  if ((m == Malformation::kBadTokenScale || m == Malformation::kTokenScaleStrides) &&
      !c.token_scales()) {
    if (!c.quantized()) draw_quantized(c, streams.fp8, true);
    draw_token_scales(c, streams.token_scales, true);
  }
}

// A malformation for 12% of the cases (only those that keep buffer sizes where the options ask),
// made applicable: a sequence to corrupt, a context with blocks, a table of >= 2 entries, query
// tokens to miscount, a tree mask to break, the variant, quantized cache or plain cache it
// corrupts.
void draw_malformation(FuzzCase& c, Rng& r, const DrawOptions& options, PartStreams& streams) {
  testing::CaseSpec& s = c.spec;
  const int kinds = static_cast<int>(Malformation::kCount) - 1;
  Malformation m = static_cast<Malformation>(1 + r.uniform(0, kinds - 1));
  if (options.table_malformations_only && !keeps_buffer_sizes(m)) {
    static const Malformation kTable[] = {Malformation::kIdOutOfRange,
                                          Malformation::kContextOverCapacity,
                                          Malformation::kNegativeContext};
    m = r.pick(kTable);
  }
  c.bad = m;
  c.bad_param = r.next();
  if (s.batch == 0) {
    s.batch = 1;
    s.context_lens = {1};
    if (c.multi_token()) c.q_lens = {1};
    fit_tree_masks(c);
  }
  if ((m == Malformation::kIdOutOfRange || m == Malformation::kBadTokenScale) &&
      std::all_of(s.context_lens.begin(), s.context_lens.end(), [](int L) { return L == 0; })) {
    s.context_lens[0] = 1;
  }
  const bool needs_queries = m == Malformation::kQIndptrStart ||
                             m == Malformation::kQIndptrDecreasing ||
                             m == Malformation::kQLenOverMax || m == Malformation::kQIndptrEnd ||
                             m == Malformation::kMaxQLen;
  if (needs_queries && !c.multi_token()) {
    draw_query_lens(c, streams.queries, streams.work_budget, true);
  }
  if ((m == Malformation::kIdOutOfRange || m == Malformation::kBadTokenScale) && c.multi_token()) {
    // A read entry (a checked row) needs a sequence with a context and a query token.
    bool read = false;
    for (int b = 0; b < s.batch; ++b) read |= s.context_lens[b] > 0 && c.q_lens[b] > 0;
    if (!read) {
      s.context_lens[0] = std::max(s.context_lens[0], 1);
      c.q_lens[0] = std::max(c.q_lens[0], 1);
      c.max_q_len = std::max(c.max_q_len, c.q_lens[0]);
      fit_tree_masks(c);
    }
  }
  if (m == Malformation::kTreeBitAboveDiagonal || m == Malformation::kTreeSpanShort ||
      m == Malformation::kTreeIndptrStart || m == Malformation::kTreeUnpaired ||
      m == Malformation::kTreeWithoutQIndptr) {
    fit_tree_malformation(c, m, streams);
  }
  if (m == Malformation::kTableStride) s.table_padding = std::max(s.table_padding, 2);
  if (m == Malformation::kNonFiniteSlope && c.alibi_slopes.empty()) {
    c.alibi_slopes = draw_slopes(streams.variants, s.num_heads);
  }
  if (m == Malformation::kBadSink && c.sinks.empty()) c.sinks = draw_sinks(streams.variants, s);
  // A bad scale needs a quantized cache (a bad per-head one its per-head scales); a scale on a
  // cache that takes none, a plain cache.
  if ((m == Malformation::kBadKvScale && !c.quantized()) ||
      (m == Malformation::kBadKvHeadScale && (!c.quantized() || c.k_scales.empty()))) {
    draw_quantized(c, streams.fp8, true, m == Malformation::kBadKvHeadScale);
  }
  if (m == Malformation::kScaleOnPlainCache && c.quantized()) {
    drop_quantized(c, streams.fp8.pick(kPlainDTypes));
  }
  fit_token_scale_malformation(c, m, streams);
}

}  // namespace

FuzzCase draw_case(std::uint64_t seed, std::uint64_t index, const DrawOptions& options) {
  Rng r(splitmix64(splitmix64(seed) ^ (index * 0xd1342543de82ef95ull + 1)));
  FuzzCase c;
  c.origin_seed = seed;
  c.origin_index = index;
  testing::CaseSpec& s = c.spec;
  s.seed = r.next();
  draw_heads(s, r);
  const bool long_ctx = r.chance(0.3);
  draw_contexts(s, r, long_ctx);
  draw_tables_and_dtypes(s, r);
  draw_values(c, r);

  // Bound the cost: most cases small, some medium, long ones bigger.
  std::int64_t budget = long_ctx ? (1 << 18) : r.chance(0.8) ? (1 << 14) : (1 << 16);
  fit_budget(s, budget);

  // A table row exactly full: the longest context fills max_blocks_per_seq * block_size.
  if (s.batch > 0 && r.chance(0.2)) {
    auto it = std::max_element(s.context_lens.begin(), s.context_lens.end());
    if (*it > 0) {
      s.table_padding = 0;
      *it = blocks_for(*it, s.block_size) * s.block_size;
    }
  }

  // Multi-token queries from a stream of their own too, before the variants (which are drawn
  // against the contexts they change); a case without them keeps every other draw. Their work
  // budget: twice what a case of one query token per sequence may read (its pool: at least 4
  // blocks).
  PartStreams streams{stream_rng(seed, index, 0x3c6ef372fe94f82bull, 7),
                      stream_rng(seed, index, 0x6a09e667f3bcc909ull, 3),
                      stream_rng(seed, index, 0x510e527fade682d1ull, 11),
                      stream_rng(seed, index, 0x1f83d9abfb41bd6bull, 13),
                      stream_rng(seed, index, 0x5be0cd19137e2179ull, 17),
                      2 * std::max(budget, 4 * static_cast<std::int64_t>(s.num_kv_heads) *
                                               s.block_size * s.head_dim)};
  draw_query_lens(c, streams.queries, streams.work_budget);
  draw_tree_masks(c, streams.trees);
  // Forked tables from a stream of their own, over the final contexts.
  Rng forks = stream_rng(seed, index, 0x9b05688c2b3e6c1full, 19);
  draw_forks(c, forks);
  draw_variants(c, streams.variants);
  // The strides too come from a stream of their own: every other draw stays as it was.
  Rng strides = stream_rng(seed, index, 0xbb67ae8584caa73bull, 5);
  draw_row_strides(c, strides, options);
  // And the cache layout.
  Rng layouts = stream_rng(seed, index, 0xa54ff53a5f1d36f1ull, 9);
  draw_layout(c, layouts, options);
  // And the quantized caches, after the variants: a soft-cap sets the magnitude the scales aim at.
  draw_quantized(c, streams.fp8);
  // Their per-token scales from a stream of their own too.
  draw_token_scales(c, streams.token_scales);

  if (r.chance(0.12)) draw_malformation(c, r, options, streams);
  return c;
}

std::int64_t kv_elements(const FuzzCase& c) { return pool_elements(c.spec); }

}  // namespace pagedattn::fuzz
