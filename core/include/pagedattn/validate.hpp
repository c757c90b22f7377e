// Validation shared by every backend: shapes, pointers, dtypes, and (where the tables are in
// host memory) every context length and every block id a sequence will read.
#pragma once

#include <cstdint>

#include "pagedattn/merge_states.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

bool is_supported_head_dim(int head_dim);
bool is_cuda_head_dim(int head_dim);  // one of kCudaHeadDims

// The argument checks every entry point shares; each throws an Error naming `name`.
void require_positive(const char* name, int value);
void require_non_null(const char* name, const void* pointer);
void require_dtype(const char* name, DType dtype);        // a DType value
void require_value_dtype(const char* name, DType dtype);  // f32, f16 or bf16 (not quantized)
void require_kv_scale(const char* name, float scale);     // in [kMinKvScale, kMaxKvScale]
// The per-tensor scales in range, and every scale at its default (1, null) unless the cache
// (dtype field `dtype_field`) is quantized (fp8 or int8).
void require_cache_scales(const char* dtype_field, DType cache, float k_scale, float v_scale,
                          const float* k_scales, const float* v_scales);
// Per-token scales (k_token_scales, v_token_scales): both or neither, a quantized cache only
// (and always for int4), and their strides (`strides`, as a cache view's with "head_dim"
// token_scales_per_row(cache, head_dim): 1, or head_dim / 32 group scales for int4) valid.
void require_token_scales(const char* dtype_field, DType cache, const float* k_token_scales,
                          const float* v_token_scales, const CacheStrides& strides, int num_blocks,
                          int num_kv_heads, int block_size, int head_dim);
// An int4 cache's shape: head_dim a multiple of kInt4GroupSize (kUnsupported naming head_dim) and
// every kv_strides even, since they count codes (kInvalidArgument naming the stride). Nothing to
// check for other dtypes.
void require_int4_cache(DType cache, int head_dim, const CacheStrides& kv_strides);
void require_block_size(int block_size);  // in [1, kMaxBlockSize]
// The block table's shape: block_size, num_blocks, max_blocks_per_seq and block_table_stride,
// and a table row's capacity within int32 (decode and mla_decode share it).
void require_table_shape(const DecodeArgs& args);
// num_q_tokens and max_q_len against q_indptr's presence (decode and mla_decode share it).
void require_query_counts(const DecodeArgs& args);
void require_head_dim(int head_dim);  // one of kSupportedHeadDims
// One of kCudaHeadDims: else Error(kUnsupported) naming head_dim, saying the CUDA backend has no
// kernel for it yet. The CUDA entry points call it first, so no other CUDA check comes before it.
void require_cuda_head_dim(int head_dim);
// A cache dtype the CUDA backend reads and writes: else (int4, for now) Error(kUnsupported)
// naming `name` (k_dtype, cache_dtype). The CUDA entry points call it after require_cuda_head_dim.
void require_cuda_cache_dtype(const char* name, DType cache);
void require_backend(const char* name, Backend backend);  // kAuto, kCpu or kCuda
void require_num_threads(int num_threads);                // in [0, kMaxThreads]

// A cache view's strides (kv_strides, or `field`): the default, or all three positive, rows of
// distinct (block, kv head, slot) not overlapping (checked by sorting the three dimensions by
// stride: each stride at least the extent of the smaller ones), and the pool's span within int64.
void require_cache_strides(const CacheStrides& strides, int num_blocks, int num_kv_heads,
                           int block_size, int head_dim, const char* field = "kv_strides");

// The options of decode() and of the cache operations: a Backend value and a thread count in
// range. The CUDA fields (stream, workspace) are the CUDA backend's to check.
void validate_options(const DecodeOptions& options);
void validate_options(const CacheOpOptions& options);
void validate_options(const MergeStatesOptions& options);

// merge_states(): counts, dtypes and pointers (rows x segments x head_dim within int64).
void validate_merge_args(const MergeStatesArgs& args);

// The slot mapping of a cache write, in host memory: every slot -1 or in
// [0, num_blocks * block_size), and no slot other than -1 twice.
void validate_slot_mapping(const CacheWriteArgs& args, const std::int32_t* slot_mapping);

// Which slots skip their token: -1 alone (write_cache), or every negative slot (write_mla_cache,
// as vLLM's MLA cache write).
enum class SlotSkip { kMinusOne, kNegative };
// The num_tokens slots of a write's slot mapping, in host memory: each one that skips or in
// [0, num_slots) (kOutOfRange naming slot_mapping[i]), and none but a skip twice
// (kInvalidArgument naming the later token).
void validate_write_slots(const std::int32_t* slot_mapping, int num_tokens, std::int64_t num_slots,
                          SlotSkip skip);

// Sizes, pointers and supported configurations. Reads no tensor. The reference, which writes no
// `out`, passes require_out = false.
void validate_shapes(const DecodeArgs& args, bool require_out = true);

// context_lens and block_table given in host memory: 0 <= L_b <= max_blocks_per_seq * block_size
// and every id in the first ceil(L_b / block_size) entries of row b lies in [0, num_blocks).
// Only the entries a query reads are checked (the others are never read): with window_left >= 0
// those from the window's first block on, and with multi-token queries (q_indptr, in host memory,
// validated by validate_q_indptr; null when args.q_indptr is) those of the sequences with query
// tokens, from the earliest query's window on.
void validate_tables(const DecodeArgs& args, const std::int32_t* context_lens,
                     const std::int32_t* block_table, const std::int32_t* q_indptr = nullptr);

// q_indptr given in host memory (args.q_indptr's values): q_indptr[0] = 0, non-decreasing, each
// sequence's count at most max_q_len, q_indptr[batch] = num_q_tokens.
void validate_q_indptr(const DecodeArgs& args, const std::int32_t* q_indptr);

// tree_mask and tree_mask_indptr given in host memory (args.tree_mask's, with q_indptr's values;
// nothing to check when args.tree_mask is null): tree_mask_indptr[0] >= 0, each sequence's span of
// at least tree_mask_bytes(n_b) bytes, and no bit above a mask's diagonal set.
void validate_tree_mask(const DecodeArgs& args, const std::uint8_t* tree_mask,
                        const std::int32_t* tree_mask_indptr, const std::int32_t* q_indptr);

// alibi_slopes and sinks given in host memory (either may be null): every slope finite, no sink
// NaN or +inf.
void validate_variant_values(const DecodeArgs& args, const float* alibi_slopes, const float* sinks);

// The per-kv-head scales of a quantized cache (k_scales, v_scales, either may be null), in host
// memory: each in [kMinKvScale, kMaxKvScale].
void validate_kv_scales(const DecodeArgs& args, const float* k_scales, const float* v_scales);

// The per-token scales (k_token_scales, v_token_scales, both null or both set), in host memory,
// with the validated context_lens, block_table and q_indptr: the scale of every row (slot, kv
// head) of the blocks validate_tables checks, below the sequence's context length, in
// [kMinKvScale, kMaxKvScale] (for int4 each of its head_dim / 32 group scales). An error names
// the row (block id, kv head, slot; and the group for int4).
void validate_token_scales(const DecodeArgs& args, const float* k_token_scales,
                           const float* v_token_scales, const std::int32_t* context_lens,
                           const std::int32_t* block_table, const std::int32_t* q_indptr);

}  // namespace pagedattn
