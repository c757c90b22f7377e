// Merging attention states. Decoding the same queries over disjoint parts of their contexts (KV
// segments: shards of a context on several GPUs, a shared prefix and each sequence's own
// suffix) gives one (out, lse) per part; merge_states combines them into the (out, lse) of
// attention over the whole context:
//   m = max_s lse_s,  w_s = exp(lse_s - m),  out = sum_s w_s out_s / sum_s w_s,
//   lse = m + log(sum_s w_s).
// A segment with lse = -inf (no tokens) weighs nothing; when every segment is empty the row is
// empty (out = 0, lse = -inf, as decode() gives for a context of 0). NaN in a segment's lse (a
// head that met a NaN or Inf, see decode()) gives NaN in that row's out and lse. The result does
// not depend on how the context was cut, up to rounding. See docs/context_parallel.md.
#pragma once

#include <cstdint>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// S segments of R rows (one row per (sequence, query head), in any order that is the same in
// every segment) of head_dim elements. For the CPU backend every pointer is host memory; for the
// CUDA backend, device memory.
//   parts:    [S][R][head_dim] in part_dtype: each segment's out, as decode() writes it
//   part_lse: [S][R] f32: each segment's lse (natural log), as decode() writes it
//   out:      [R][head_dim] in out_dtype;  lse: [R] f32, may be null
// out may not overlap the inputs.
struct MergeStatesArgs {
  int num_segments = 0;
  int num_rows = 0;
  int head_dim = 0;
  const void* parts = nullptr;
  DType part_dtype = DType::kF32;
  const float* part_lse = nullptr;
  void* out = nullptr;
  DType out_dtype = DType::kF32;
  float* lse = nullptr;
};

struct MergeStatesOptions {
  Backend backend = Backend::kAuto;  // resolved as for decode(); kAuto, kCpu or kCuda
  int num_threads = 0;               // CPU: worker threads in [1, kMaxThreads]; 0: OpenMP's default
  void* cuda_stream = nullptr;       // CUDA: the cudaStream_t to run on (nullptr = default)
};

// Throws pagedattn::Error naming the argument on bad input, before writing anything.
void merge_states(const MergeStatesArgs& args, const MergeStatesOptions& options = {});

}  // namespace pagedattn
