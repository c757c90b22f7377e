// The seam between the dispatch layer and the backends: what each backend implements, and the
// options it runs with. Arguments arrive validated. Not installed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "pagedattn/mla.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/shared_prefix.hpp"
#include "pagedattn/split_plan.hpp"

namespace pagedattn::detail {

// The options a backend runs with: the public DecodeOptions plus a knob only the tests and the
// fuzzer set, through detail::decode (dispatch/include/pagedattn/detail/dispatch.hpp). The
// public decode() runs with it off.
struct DecodeOptions : pagedattn::DecodeOptions {
  DecodeOptions() = default;
  DecodeOptions(const pagedattn::DecodeOptions& o) : pagedattn::DecodeOptions(o) {}  // NOLINT

  // One work item per (sequence, kv head), no split-KV: checks that the split plan does not
  // change results beyond rounding. Slower on long contexts.
  bool single_split = false;
};

namespace cpu {
// Runs on host memory; context_lens and block_table already validated.
void decode(const DecodeArgs& args, const DecodeOptions& options);
// The split plan decode runs for these (validated) arguments when called on this thread; with
// q_indptr, over the query tokens in row order, each a sequence of its own (its context ending
// at its position). So tests can check the plan, or act on it.
SplitPlan split_plan(const DecodeArgs& args, const DecodeOptions& options);
// The shared prefixes decode reads once per group for these (validated) arguments: none when
// share_prefixes is off or the call is batch-invariant. So tests can check that sharing ran.
SharedPrefixes shared_prefixes(const DecodeArgs& args, const DecodeOptions& options);
// MLA decode on host memory (pagedattn/mla.hpp); arguments, tables and q_indptr validated.
void mla_decode(const MlaDecodeArgs& args, const DecodeOptions& options);
}  // namespace cpu

namespace cuda {
// Whether the CUDA backend was built and a device is usable; `why` says what is missing.
bool available(std::string* why);
// Runs on device memory; check_launch first.
void decode(const DecodeArgs& args, const DecodeOptions& options);
// What decode refuses before any launch (batch > 0): q, the caches and the workspace not 16-byte
// aligned, a pool of more than 2^31 - 1 cache rows, a kernel that does not fit on the device, and
// with cuda_checked the device tables (read back, waiting for the stream).
void check_launch(const DecodeArgs& args, const pagedattn::DecodeOptions& options);
// MLA decode on device memory (pagedattn/mla.hpp); arguments validated, check_mla_launch first.
void mla_decode(const MlaDecodeArgs& args, const DecodeOptions& options);
// What the CUDA MLA kernel refuses before any launch: dtypes, widths and cache layouts it has no
// kernel for, and a kernel that does not fit on the device, each an error naming the argument.
void check_mla_launch(const MlaDecodeArgs& args, const pagedattn::DecodeOptions& options);
// Device workspace bytes mla_decode needs for these shapes (pagedattn::cuda_mla_workspace_size).
std::size_t mla_workspace_size(const MlaDecodeArgs& args, const DecodeOptions& options);
// Device workspace bytes decode needs for these shapes (see pagedattn::cuda_workspace_size).
std::size_t workspace_size(const DecodeArgs& args, bool batch_invariant);
// The split kernel's build decode runs for these shapes (dense: more CTAs per SM, fp8
// tensor-core kernels, cuda/split_kernel.cuh; many_rows: the Hopper many-row kernel,
// cuda/hopper/), the CTAs per SM and waves of it its plan aims at (cuda/kernel_choice.cpp,
// choose_split_kernel), and the CTAs per SM each build fits (the same for both where there is no
// dense build), so the tests can check each choice.
struct SplitChoice {
  bool dense = false;
  bool many_rows = false;
  int waves = 1;
  int ctas_per_sm = 0;
  int plain_fits = 0;
  int dense_fits = 0;
};
SplitChoice split_choice(const DecodeArgs& args);
// `bytes` of device memory from the library's stream-ordered pool on the current device, given
// back on `stream` (a cudaStream_t) when the last owner lets go: uses enqueued meanwhile finish
// first.
std::shared_ptr<void> stream_scratch(std::size_t bytes, void* stream);
// Copies between host and device memory on `stream` and waits for the copy.
void copy_and_wait(void* dst, const void* src, std::size_t bytes, void* stream);
}  // namespace cuda

}  // namespace pagedattn::detail
