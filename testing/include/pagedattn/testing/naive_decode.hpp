// The naive baseline of pagedattn-bench and pagedattn-sim: the per-query-head loop a user writes
// first (the seed's first kernel, grid (batch, q_head)). Every query head re-reads its kv head's
// keys and values one token at a time, dot products are scalar and each weight comes from a
// scalar exp.
#pragma once

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::testing {

// On the CPU: the same contract as decode() (out and lse written for every row, the attention
// variants, multi-token queries and their tree masks, the cache layout, fp8 caches and their
// scales included), parallel over (query token, head) rows with `threads` OpenMP threads. Arguments
// are assumed valid; q and out dense.
void naive_decode(const DecodeArgs& args, int threads);

// On the current CUDA device, every pointer of args in device memory: one CTA per (query token,
// head), a thread per element of head_dim, a CTA-wide reduction per token. The same contract for
// f32, f16 and bf16 caches with one query token per sequence (q_indptr null); anything else
// throws kUnsupported naming the argument. Enqueued on the default stream; throws
// kBackendUnavailable in a build without CUDA.
void naive_decode_cuda(const DecodeArgs& args);

}  // namespace pagedattn::testing
