// The combine: merges the partial states of each (query row, query head) over its sequence's
// splits, in split order, and writes out = acc / l and lse (natural log); an empty context gives
// out = 0, lse = -inf, and a sequence of one split is skipped (its split CTA wrote out and lse)
// unless merge_single_splits. It runs after the split kernel, as a programmatic dependent launch
// where the device supports one (sm_90).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagedattn/dtype.hpp"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

struct CombineParams {
  // Partials of one (sequence, split): max_q * num_heads rows, query token major.
  const float* part_ml;     // [partials][2]: m (log2 units), l
  const float* part_acc;    // [partials][head_dim]
  const int* split_offset;  // [batch + 1]: the first partial of each sequence, in splits
  // Multi-token queries (SplitParams::q_indptr, q_rows, max_q): null for one row per sequence.
  const std::int32_t* q_indptr;
  int q_rows, max_q;
  void* out;
  long long out_stride;  // elements between consecutive sequences' rows of out
  float* lse;
  int batch, num_heads, head_dim;
  // Merge the sequences of one split too (their split CTA wrote a partial state, not out).
  bool merge_single_splits = false;
};

// Enqueues the combine on `stream`, finishing each row with the variant policy var (the same as
// the split kernel's). pdl: launch it as a programmatic dependent of the kernel before it (which
// must have triggered griddepcontrol.launch_dependents). Throws on a launch error.
void launch_combine(const CombineParams& params, const GeneralVariant& var, DType out_dtype,
                    bool pdl, cudaStream_t stream);

// Whether the build holds machine code or PTX the current device can run (the combine stands for
// every kernel of the library: all are built for the same architectures).
bool combine_has_image();
// The virtual architecture the current device runs this library's kernels from (90 for sm_90
// code; 80 when an sm_80-only build runs on a newer GPU through its PTX), 0 when none runs. All
// kernels are built for the same architectures, so the combine's tells for every one.
int kernels_ptx_version();

}  // namespace pagedattn::detail::cuda
