// The parts of a fuzz case that draw_case draws each from a stream of its own (rng.hpp), so that
// a case without one keeps every other draw: multi-token queries and their tree masks, the
// attention variants, the q and out row strides, the cache layout, quantized caches and their
// per-token scales.
#pragma once

#include <cstdint>
#include <vector>

#include "draw_case.hpp"
#include "fuzz_case.hpp"
#include "rng.hpp"

namespace pagedattn::fuzz {

// Multi-token queries (draw_queries.cpp): per-sequence counts and max_q_len for a quarter of the
// cases (every case when `force`), the contexts and counts trimmed to `work_budget` elements.
void draw_query_lens(FuzzCase& c, Rng& r, std::int64_t work_budget, bool force = false);
// Tree masks over a multi-token case's query tokens (draw_queries.cpp), for 30% of them (every
// one when `force`); none for a case without multi-token queries.
void draw_tree_masks(FuzzCase& c, Rng& r, bool force = false);

// Forked groups (draw_forks.cpp): for a quarter of the cases of two sequences or more, runs of
// 2 to 8 consecutive sequences (or the whole batch) forked from their first one after a prefix
// on a block boundary, inside a block, as long as the contexts or anywhere (CaseSpec::fork_prefix).
void draw_forks(FuzzCase& c, Rng& r);

// The attention variants (draw_variants.cpp): a window, a soft-cap, ALiBi slopes and sinks.
void draw_variants(FuzzCase& c, Rng& r);
std::vector<float> draw_slopes(Rng& r, int H);
std::vector<float> draw_sinks(Rng& r, const testing::CaseSpec& s);

// Where q, out, K and V live and in what format (draw_storage.cpp): row strides, the cache
// layout, quantized caches (fp8 or int8: every case when `force`, with per-head scales when
// `force_per_head`).
void draw_row_strides(FuzzCase& c, Rng& r, const DrawOptions& options);
void draw_layout(FuzzCase& c, Rng& r, const DrawOptions& options);
void draw_quantized(FuzzCase& c, Rng& r, bool force = false, bool force_per_head = false);
// Per-token scales and their layout for some quantized cases (every one when `force`).
void draw_token_scales(FuzzCase& c, Rng& r, bool force = false);
// Without per-token scales.
void drop_token_scales(FuzzCase& c);
// Back to a cache of `t` (not quantized), without scales of any kind.
void drop_quantized(FuzzCase& c, DType t);

}  // namespace pagedattn::fuzz
