// What the split kernel gets: the call's shapes and pointers, the plan options and where the
// partial states go. Filled on the host (decode_params.cu), read by every CTA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "pagedattn/dtype.hpp"
#include "pagedattn/fast_div.hpp"
#include "pagedattn/split_plan.hpp"
#include "split_build.hpp"
#include "variant_policy.cuh"

namespace pagedattn::detail::cuda {

struct SplitParams {
  const void* q;
  int q_dtype;  // DType as int
  // Elements between consecutive sequences' rows of q and of out (DecodeArgs::q_stride(),
  // out_stride()); a sequence's heads are contiguous.
  long long q_stride, out_stride;
  const void* k;
  const void* v;
  const std::int32_t* table;
  const std::int32_t* lens;
  int batch, num_heads, num_kv_heads, group, block_size, num_blocks, max_blocks, table_stride;
  FastDiv block_div;  // token -> (block, slot)
  // The cache layout (DecodeArgs::kv_strides) in row units of row_unit bytes, the greatest
  // common divisor of the block and token strides (a row of head_dim elements for the dense HND
  // layout, num_kv_heads of them for NHD): slot s of block b is b * block_units + s * token_units
  // units past its kv head's first row, which is head_bytes * kv_head bytes past the cache.
  int block_units, token_units, row_unit;
  long long head_bytes;
  float scale_log2;  // scale * log2(e): scores are kept in log2 units
  // Quantized caches' dequantization scales (DecodeArgs::k_scale, ...; 1 and null otherwise),
  // folded into a kv head's logit scale and into its weighted sum (simt_path.cuh).
  float k_scale, v_scale;
  const float* k_scales;
  const float* v_scales;
  // Per-token scales (DecodeArgs::k_token_scales; null: none), read by the CUDA-core path and the
  // tensor cores' token-scale build (SplitBuild::token_scales): slot s of block b of kv head kv
  // has its scale
  // kv * ts_head + b * ts_block + s * ts_token floats past the pointer (token_scale_layout()).
  const float* k_token_scales;
  const float* v_token_scales;
  long long ts_block, ts_head, ts_token;
  // plan.window_left is DecodeArgs::window_left. The other variants are the kernel's variant
  // policy (variant_policy.cuh), an argument of its own.
  PlanOptions plan;
  // Tensor-core path: P enters the P V product as hi + lo parts of the cache dtype (f32-level
  // accuracy), or as hi alone where out's dtype rounds more coarsely than P's (mma_path.cuh).
  bool p_lo;
  // Multi-token queries (DecodeArgs::q_indptr, or null: one query token per sequence, at row b):
  // q_rows rows of q, out and lse (num_q_tokens, or batch) and at most max_q tokens per sequence
  // (max_q_len, or 1); what the kernels read from q_indptr is clamped into those bounds.
  const std::int32_t* q_indptr;
  int q_rows, max_q;
  // Tree masks (DecodeArgs::tree_mask, tree_mask_indptr; null: the causal rule among a
  // sequence's query tokens), read only where the rows of a sequence disagree (query_rows.cuh).
  const std::uint8_t* tree_mask;
  const std::int32_t* tree_mask_indptr;
  int rows_per_cta;  // kMmaRowsPerCta or kSimtRowsPerCta (split_build.hpp)
  int row_chunks;    // CTAs per item: ceil(group * max_q / rows_per_cta)
  // The partial states of one (sequence, split) are max_q * num_heads rows, query token major.
  float* part_ml;     // [partials][2]: m (log2 units), l
  float* part_acc;    // [partials][head_dim]
  int* split_offset;  // [batch + 1], written by CTA 0 for the combine
  // A sequence with a single split is finished by its CTA: out (out_dtype) and lse (may be
  // null) written directly, no partial state; the combine skips it.
  void* out;
  int out_dtype;  // DType as int
  float* lse;
  // Launched as a programmatic dependent of the stream's previous kernel (sm_90): the kernel
  // waits for it on the device (split_kernel.cuh).
  bool pdl;
};

// One CTA's share of the plan, derived on the device (split_kernel.cuh) and handed to the
// compute paths.
struct CtaItem {
  int seq;                 // b
  int kv;                  // kv head
  int row_begin, rows;     // this CTA's rows: [row_begin, row_begin + rows) of the kv head's
  int q_row0, n_q;         // the sequence's first row of q / out / lse, and its query tokens
  std::int64_t part_base;  // first partial-state index of this (sequence, split)
  bool finish;             // the sequence's only split: write out and lse, no partial state
};

// CTAs per SM the wide build is compiled for (0: the compiler's own register budget). At head
// dim 64 the compiler's own budget leaves room for one CTA fewer than the plain build; capped
// for four (a few dozen bytes of spills) it runs faster at q_len 4 and 8 (docs/cuda.md).
constexpr int wide_min_ctas(int head_dim) { return head_dim == 64 ? 4 : 0; }

// Calls f(std::integral_constant<int, D>) for the compile-time head_dim D and returns true, or
// returns false for a head dim with no kernel (require_cuda_head_dim refuses those first).
template <typename F>
bool with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{}), true;
    case 80:
      return f(std::integral_constant<int, 80>{}), true;
    case 96:
      return f(std::integral_constant<int, 96>{}), true;
    case 112:
      return f(std::integral_constant<int, 112>{}), true;
    case 128:
      return f(std::integral_constant<int, 128>{}), true;
    case 192:
      return f(std::integral_constant<int, 192>{}), true;
    case 256:
      return f(std::integral_constant<int, 256>{}), true;
    default:
      return false;
  }
}

// Every build of the split kernel for cache dtype T (float, __half, __nv_bfloat16, fp8_e4m3_t,
// fp8_e5m2_t, int8_code_t) at head dim D. Each pair is compiled in a translation unit of its own
// (split_instance.cu.in, generated by cuda/CMakeLists.txt), so a parallel build spreads them
// over every core. launch enqueues the build b asks for with the library's variant policy (its
// error is checked by the caller);
// facts reports how many of its CTAs fit on one SM of the current device (0: none) and its
// shared memory.
template <typename T, int D>
struct SplitKernels {
  static void launch(const SplitParams& p, const GeneralVariant& var, SplitBuild b, int grid,
                     cudaStream_t stream);
  static BuildFacts facts(SplitBuild b);
};

// The split kernel of cache dtype k_dtype at head_dim (split_dispatch.cu): launch build b of it
// (false when no kernel was built for the head dim: the caller reports it), or report what the
// current device offers of build b (the planner sizes its waves with it; no CTA without a
// kernel). f32 has no tensor-core build: b is ignored there.
bool launch_split(const SplitParams& p, const GeneralVariant& var, DType k_dtype, int head_dim,
                  SplitBuild b, int grid, cudaStream_t stream);
BuildFacts split_build_facts(DType k_dtype, int head_dim, SplitBuild b);

}  // namespace pagedattn::detail::cuda
