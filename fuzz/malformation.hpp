// The deliberately invalid inputs a fuzz case may carry, planted in its arguments after the case
// is built (plant_malformation.hpp), each with the error the API must raise for it.
#pragma once

namespace pagedattn::fuzz {

enum class Malformation : int {
  kNone = 0,
  kIdOutOfRange,          // a block id inside a context outside [0, num_blocks)
  kContextOverCapacity,   // context_lens[b] > max_blocks_per_seq * block_size
  kNegativeContext,       // context_lens[b] < 0
  kHeadRatio,             // num_heads % num_kv_heads != 0
  kGroupTooLarge,         // num_heads / num_kv_heads > kMaxGroupSize
  kNullPointer,           // one of q, k_cache, v_cache, block_table, context_lens, out is null
  kHeadDim,               // an unsupported head_dim
  kBlockSize,             // block_size 0, negative or > kMaxBlockSize
  kTableStride,           // 0 < block_table_stride < max_blocks_per_seq
  kDtypeMismatch,         // v_dtype != k_dtype
  kBadDtype,              // a dtype value that is not a DType
  kNonFiniteScale,        // scale NaN or Inf
  kNegativeBatch,         // batch < 0
  kWindowLeft,            // window_left < -1
  kSoftCap,               // logits_soft_cap negative, NaN or infinite
  kNonFiniteSlope,        // an ALiBi slope NaN or infinite
  kBadSink,               // a sink NaN or +inf
  kRowStride,             // q_row_stride or out_row_stride negative or in (0, num_heads * head_dim)
  kQIndptrStart,          // q_indptr[0] != 0
  kQIndptrDecreasing,     // q_indptr[b + 1] < q_indptr[b]
  kQLenOverMax,           // a sequence's query tokens above max_q_len
  kQIndptrEnd,            // q_indptr[batch] != num_q_tokens
  kMaxQLen,               // max_q_len 0 or negative with q_indptr
  kQTokensWithoutIndptr,  // num_q_tokens (or max_q_len) set without q_indptr
  kKvStrides,             // kv_strides zero mixed with nonzero, negative, overlapping or too large
  kFp8ValueDtype,         // q_dtype or out_dtype fp8 or int8 (they store K and V caches only)
  kBadKvScale,         // k_scale or v_scale of a quantized cache out of [kMinKvScale, kMaxKvScale]
  kScaleOnPlainCache,  // a K/V scale other than 1, or a per-head array, on a plain cache
  kBadKvHeadScale,     // one per-head scale (k_scales[h] or v_scales[h]) out of range
  kTreeBitAboveDiagonal,     // a tree mask bit (i, j) with j > i set
  kTreeSpanShort,            // tree_mask_indptr[b + 1] leaving sequence b fewer bytes than its mask
  kTreeIndptrStart,          // tree_mask_indptr[0] negative
  kTreeUnpaired,             // tree_mask without tree_mask_indptr, or the other way round
  kTreeWithoutQIndptr,       // a tree mask without q_indptr
  kTokenScalesOnPlainCache,  // k_token_scales and v_token_scales on an f32, f16 or bf16 cache
  kTokenScalesUnpaired,      // one of k_token_scales, v_token_scales alone, or strides alone
  kBadTokenScale,            // a checked row's per-token scale out of range (NaN, 0, ...)
  kTokenScaleStrides,        // token_scale_strides zero among nonzero, negative, overlapping...
  kCount
};

// The name case files use ("id-out-of-range", ...), "unknown" outside the enum.
const char* malformation_name(Malformation m);
// Table-content malformations keep every buffer size honest, so backends that copy buffers by
// the declared shapes (the CUDA round trip) can be given them too.
bool keeps_buffer_sizes(Malformation m);

}  // namespace pagedattn::fuzz
