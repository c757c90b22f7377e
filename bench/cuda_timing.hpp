// The CUDA side of pagedattn-bench: the GPU read ceiling and the timing of one shape. Built from
// cuda_timing.cu when the CUDA backend is, else from cuda_timing_unavailable.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "bench_variants.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/kv_layouts.hpp"

namespace pagedattn::bench {

// The scale of an fp8 cache's K and V (DecodeArgs::k_scale, v_scale; no per-head scales): the
// codes hold the values / 0.5, so the values themselves are N(0, 1) as in the other dtypes, the
// codes N(0, 2), well inside both formats. Any scale in range costs a decode step the same.
inline constexpr float kFp8KvScale = 0.5f;
// The scale of an int8 cache: codes of unit-variance values spread to about +-100.
inline constexpr float kInt8KvScale = 1.f / 32;
// The scale of an int4 cache (codes -8..7 drawn uniform, times group scales in [0.25, 4)): values
// of about unit variance.
inline constexpr float kInt4KvScale = 1.f / 8;

struct Shape {
  int batch, heads, kv_heads, head_dim, context, block_size;
  int long_first = 0;  // > 0: sequence 0 holds this many tokens instead (a skewed batch)
  // Query tokens per sequence (DecodeArgs::q_indptr, uniform); 1: plain decode, no q_indptr.
  int q_len = 1;

  int context_of(int b) const { return b == 0 && long_first > 0 ? long_first : context; }
  // Rows of q, out and lse.
  std::int64_t q_rows() const { return static_cast<std::int64_t>(batch) * q_len; }
  double total_tokens() const {
    return batch <= 0
               ? 0.0
               : static_cast<double>(batch - 1) * context + static_cast<double>(context_of(0));
  }
};

struct CudaTimingOptions {
  bool graph = true;             // time CUDA-graph replays (false: plain launches)
  bool contiguous = false;       // block tables in order instead of a random permutation
  bool batch_invariant = false;  // DecodeOptions::batch_invariant
  int min_iterations = 50;
  Variants variants;  // applied to every step (their slopes and sinks copied to the device)
  // Where K and V live (kv_strides); kHnd is the default dense layout, kv_strides left 0.
  testing::KvLayout layout = testing::KvLayout::kHnd;
  // The K/V cache dtype (--kv-dtype); unset: the dtype of q and out. An fp8 cache is scaled by
  // kFp8KvScale.
  std::optional<DType> kv_dtype;
  // Per-token K and V scales (DecodeArgs::k_token_scales, dense) on a quantized cache: random
  // powers of two in [1/2, 2], so the values keep their spread.
  bool token_scales = false;
  // With q_len > 1: the tree masks of --tree-mask (random_tree_masks) instead of the causal rule.
  bool tree_mask = false;
};

struct Timing {
  double ms;       // median time of one decode step
  double rel_err;  // max |out - ref| / max |ref| against the f64 reference
};

// Streaming-read ceiling of the current GPU in GB/s (16-byte loads, several in flight, a buffer
// far larger than L2, best grid).
double cuda_read_ceiling_gbps();

// The median time (ms) of one of `reps` steps enqueued back to back on `stream` (a
// cudaStream_t; null: a stream of its own): step(r, stream) enqueues step r. The steps run as one
// CUDA graph (graph) or as plain launches, timed with CUDA events after a warm-up run.
double cuda_time_steps(const std::function<void(int, void*)>& step, int reps, void* stream,
                       bool graph, int min_iterations);

// Times decode on the CUDA backend for one shape (every sequence at `context` tokens, sequence 0
// at long_first when set, each with q_len query tokens), with inputs rotated across more than the
// L2 size. `dtype` is q's and out's, options.kv_dtype (when set) the caches'.
Timing cuda_time_shape(const Shape& shape, DType dtype, const CudaTimingOptions& options);

}  // namespace pagedattn::bench
