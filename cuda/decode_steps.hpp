// The host steps of a CUDA decode, each its own function, in the order decode (decode_cuda.cu)
// runs them: what is refused before any launch (can_implement), the plan of the call (its split
// kernel, plan options, grid bound and workspace), the kernels' parameters and variant policy, then
// the launches. Internal to the backend.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "combine.cuh"
#include "kernel_choice.hpp"
#include "pagedattn/detail/backends.hpp"
#include "split_params.cuh"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

// The cache layout as the kernels address it (SplitParams::block_units and the rest): rows are
// read in 16-byte pieces, so every stride must be a multiple of 16 bytes, and a row's position
// is a 32-bit count of row units (the largest unit dividing the block and token strides).
struct RowUnits {
  int block_units, token_units, row_unit;
  long long head_bytes;
};

// can_implement.cu: everything check_launch refuses (alignment, strides, 32-bit row indices, a
// kernel that does not fit on the device, and with cuda_checked the device tables), each an
// error naming the argument. Returns the layout in row units, which the parameters take.
RowUnits can_implement(const DecodeArgs& a, const pagedattn::DecodeOptions& options);

// checked_mode.cu: reads the device tables (context lengths, block table, q_indptr) and the
// per-head values (ALiBi slopes, sinks, kv scales) back on `stream`, waits for them and validates
// them exactly as the CPU path does.
void check_device_tables(const DecodeArgs& a, cudaStream_t stream);

// decode_plan.cu: the split kernel for this call on the current device (choose_split_kernel over
// what the occupancy calculator reports of its builds; for a batch-invariant decode, from what
// each sequence owns alone); a kernel that fits nowhere is an error naming head_dim.
KernelChoice split_kernel_for(const DecodeArgs& a, bool batch_invariant);

// Where the partial states go, carved from one workspace buffer in this order, each part
// 256-byte aligned.
struct WorkspaceLayout {
  std::size_t offsets_bytes = 0;  // split_offset: [batch + 1] int
  std::size_t ml_bytes = 0;       // part_ml: [partials][2] float
  std::size_t acc_bytes = 0;      // part_acc: [partials][head_dim] float
  std::size_t total = 0;
};

// The plan of one call, from shapes only: the grid and the workspace cover any context lengths
// within the table's capacity (max_plan_splits, core/split_plan.hpp), so a captured graph replays
// with new lengths.
struct DecodePlan {
  KernelChoice kernel;
  PlanOptions options;
  std::int64_t splits = 0;  // the plan's most splits, for any lengths
  WorkspaceLayout workspace;
};
DecodePlan plan_decode(const DecodeArgs& a, bool batch_invariant);

// decode_params.cu: the split kernel's parameters for a call, its plan, its layout in row units
// and a workspace of plan.workspace.total bytes; the combine's from those.
SplitParams make_split_params(const DecodeArgs& a, const DecodePlan& plan, const RowUnits& units,
                              char* workspace);
CombineParams make_combine_params(const DecodeArgs& a, const SplitParams& p);
// The variant policy every decode runs (variant_policy.cuh), from the call's soft-cap, ALiBi
// slopes and sinks.
GeneralVariant general_variant(const DecodeArgs& a);

}  // namespace pagedattn::detail::cuda
