// The naive baseline of pagedattn-bench: the per-query-head scalar loop a user writes first (the
// seed's first kernel, grid (batch, q_head), on the CPU). Every query head re-reads its kv head's
// keys and values, dot products are scalar and each block's weights come from scalar exp.
#pragma once

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::bench {

// Same contract as decode() (out and lse written for every row, the attention variants and
// multi-token queries and the cache layout included, fp8 caches and their scales too), parallel
// over (query token, head) rows with `threads` OpenMP threads. Arguments are assumed valid; q and
// out dense.
void naive_decode(const DecodeArgs& args, int threads);

}  // namespace pagedattn::bench
