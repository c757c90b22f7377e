// The plan of one CUDA decode (decode_steps.hpp): its split kernel on the current device, the
// split plan's options, the grid bound and the workspace, from shapes only.
#include <cuda_runtime.h>

#include <string>

#include "decode_steps.hpp"
#include "device_info.hpp"

namespace pagedattn::detail::cuda {
namespace {

constexpr std::size_t align256(std::size_t n) { return (n + 255) & ~std::size_t(255); }

WorkspaceLayout workspace_layout(const DecodeArgs& a, std::int64_t splits) {
  WorkspaceLayout l;
  // Each (sequence, split) holds max_q_len * num_heads partial states.
  const std::size_t partials =
      static_cast<std::size_t>(splits) * a.num_heads * static_cast<std::size_t>(a.q_len_bound());
  l.offsets_bytes = align256(static_cast<std::size_t>(a.batch + 1) * sizeof(int));
  l.ml_bytes = align256(partials * 2 * sizeof(float));
  l.acc_bytes = align256(partials * a.head_dim * sizeof(float));
  l.total = l.offsets_bytes + l.ml_bytes + l.acc_bytes;
  return l;
}

// A split kernel that does not fit on this device (head dims 192 and 256 on sm_86 / sm_89, 99 KB
// of shared memory per block): an error naming head_dim and the device's limit.
[[noreturn]] void kernel_does_not_fit(const DecodeArgs& a) {
  cudaGetLastError();  // the failed attribute call's error is reported here, not later
  const DeviceInfo& d = current_device();
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d.device);
  fail(ErrorCode::kUnsupported, "head_dim", a.head_dim,
       std::string("the CUDA kernel for this head dim and k_dtype ") + dtype_name(a.k_dtype) +
           " needs more shared memory per block than this GPU (compute capability " +
           std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) + ") allows, " +
           std::to_string(optin) + " bytes");
}

}  // namespace

KernelChoice split_kernel_for(const DecodeArgs& a, bool batch_invariant) {
  const CallShape call = call_shape(a);
  // A batch-invariant decode takes its build from what a sequence owns: as if each had one query
  // token (the batch's most would pick the wide, tf32 or many-row build for all of them), and
  // never the dense fp8 build, which is weighed on the batch. Its row chunks still cover the
  // batch's rows.
  CallShape shape = call;
  if (batch_invariant) shape.q_len = 1;
  const SplitBuild candidate = candidate_build(shape);
  KernelFacts facts;
  facts.plain = split_build_facts(a.k_dtype, a.head_dim, candidate);
  if (facts.plain.ctas_per_sm <= 0 && candidate.mma && a.k_dtype == DType::kF32) {
    facts.simt = split_build_facts(a.k_dtype, a.head_dim, SplitBuild{});
  }
  if (facts.plain.ctas_per_sm <= 0 && facts.simt.ctas_per_sm <= 0) kernel_does_not_fit(a);
  facts.sms = current_device().sms;
  if (many_rows_serves(shape)) {
    SplitBuild many_rows = candidate;
    many_rows.hopper = true;
    facts.many_rows = split_build_facts(a.k_dtype, a.head_dim, many_rows);
  }
  if (!batch_invariant && !candidate.token_scales && weighs_dense(shape, candidate, facts.plain)) {
    SplitBuild dense = candidate;
    dense.dense = true;
    facts.dense = split_build_facts(a.k_dtype, a.head_dim, dense);
  }
  KernelChoice k = choose_split_kernel(shape, facts);
  if (batch_invariant) k.row_chunks = chunks_of_rows(call, k.rows_per_cta);
  return k;
}

DecodePlan plan_decode(const DecodeArgs& a, bool batch_invariant) {
  DecodePlan plan;
  plan.kernel = split_kernel_for(a, batch_invariant);
  plan.options = plan_options(plan.kernel, a.window_left);
  if (batch_invariant) make_batch_invariant(plan.options);  // splits from each sequence alone
  plan.splits =
      max_plan_splits(a.batch, a.max_blocks_per_seq, a.num_kv_heads, a.block_size, plan.options);
  plan.workspace = workspace_layout(a, plan.splits);
  return plan;
}

std::size_t workspace_size(const DecodeArgs& a, bool batch_invariant) {
  return plan_decode(a, batch_invariant).workspace.total;
}

SplitChoice split_choice(const DecodeArgs& a) {
  const KernelChoice k = split_kernel_for(a, false);
  SplitBuild plain = k.build, dense = k.build;
  plain.dense = false;
  dense.dense = true;
  return {k.build.dense,
          k.build.hopper,
          k.waves,
          k.ctas_per_sm,
          split_build_facts(a.k_dtype, a.head_dim, plain).ctas_per_sm,
          split_build_facts(a.k_dtype, a.head_dim, dense).ctas_per_sm};
}

}  // namespace pagedattn::detail::cuda
