// The CUDA backend's decode: its steps (decode_steps.hpp) in order, then the two launches (split
// partials, then combine) on the caller's stream. No host synchronization (checked mode
// excepted: it must read the tables on the host); with a caller workspace, no allocation either.
#include <cuda_runtime.h>

#include <optional>
#include <string>

#include "cuda_error.hpp"
#include "decode_steps.hpp"
#include "device_info.hpp"
#include "pagedattn/validate.hpp"
#include "workspace.hpp"

namespace pagedattn::detail::cuda {
namespace {

// Enqueues the split kernel over the plan's grid, or, with no table entries at all (every
// context 0), zeroes the split offsets so the combine sees no splits.
void launch_splits(const DecodeArgs& a, const DecodePlan& plan, const SplitParams& p,
                   const GeneralVariant& var, cudaStream_t stream) {
  if (plan.splits == 0) {
    check(cudaMemsetAsync(p.split_offset, 0, (a.batch + 1) * sizeof(int), stream),
          "cudaMemsetAsync");
    return;
  }
  const std::int64_t grid64 = plan.splits * a.num_kv_heads * p.row_chunks;
  if (grid64 > INT32_MAX) {
    fail(ErrorCode::kUnsupported, "batch", a.batch, "too many work items for one launch");
  }
  if (!launch_split(p, var, a.k_dtype, a.head_dim, plan.kernel.build, static_cast<int>(grid64),
                    stream)) {
    fail(
        ErrorCode::kUnsupported, "head_dim", a.head_dim,
        std::string("no CUDA kernel built for this head dim and k_dtype ") + dtype_name(a.k_dtype));
  }
  check(cudaGetLastError(), "split_kernel launch");
}

}  // namespace

bool available(std::string* why) { return device_usable(why); }

void decode(const DecodeArgs& a, const DecodeOptions& options) {
  if (a.batch == 0) return;
  const RowUnits units = can_implement(a, options);
  cudaStream_t stream = static_cast<cudaStream_t>(options.cuda_stream);
  // The grid and the workspace depend on shapes only, sized for the split plan; single_split
  // needs fewer splits, so the same grid and workspace serve it.
  DecodePlan plan = plan_decode(a, options.batch_invariant);
  plan.options.single_split = options.single_split;
  std::optional<StreamWorkspace> own;  // returned to the pool on this stream when decode ends
  char* ws = call_workspace(options, plan.workspace.total, stream, &own, "cuda_workspace_size()");
  const SplitParams p = make_split_params(a, plan, units, ws);
  const GeneralVariant var = general_variant(a);
  launch_splits(a, plan, p, var, stream);
  // With splits, on sm_90, the combine is a programmatic dependent launch: its CTAs are scheduled
  // while the split grid drains and wait on the device (griddepcontrol.wait) instead of paying a
  // launch after it.
  launch_combine(make_combine_params(a, p), var, a.out_dtype, plan.splits > 0 && p.pdl, stream);
}

}  // namespace pagedattn::detail::cuda

namespace pagedattn {

std::size_t cuda_workspace_size(const DecodeArgs& args) {
  return cuda_workspace_size(args, DecodeOptions{});
}

std::size_t cuda_workspace_size(const DecodeArgs& args, const DecodeOptions& options) {
  validate_shapes(args);
  require_cuda_head_dim(args.head_dim);               // before the device: no kernel to size for
  require_cuda_cache_dtype("k_dtype", args.k_dtype);  // int4: no kernel either
  std::string why;
  if (!detail::cuda::available(&why)) {
    fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: " + why);
  }
  return detail::cuda::workspace_size(args, options.batch_invariant);
}

}  // namespace pagedattn
