// Validation of MLA decode's arguments (pagedattn/mla.hpp), shared by every backend, and the
// latent cache checks the cache writes share with it.
#pragma once

#include "pagedattn/mla.hpp"

namespace pagedattn {

// The latent cache's shape, which decode and the cache writes (pagedattn/mla_cache.hpp) share:
// kv_lora_rank (a multiple of 16 in [16, 1024]) and rope_dim (in [0, 256]), block_size,
// num_blocks >= 0, each part's strides (both 0, or positive with rows that do not overlap) and
// kv_dtype (f32, f16, bf16 or fp8; int8 and int4 are kUnsupported).
void validate_mla_cache_shape(int kv_lora_rank, int rope_dim, int block_size, int num_blocks,
                              const MlaPartStrides& c_strides, const MlaPartStrides& kpe_strides,
                              DType kv_dtype);
// kv_scale in [kMinKvScale, kMaxKvScale] for an fp8 kv_dtype, exactly 1 for any other.
void require_mla_kv_scale(DType kv_dtype, float kv_scale);

// Sizes, strides, dtypes and pointers. Reads no tensor. The reference passes require_out = false.
void validate_mla_shapes(const MlaDecodeArgs& args, bool require_out = true);

// q_indptr, context_lens and block_table in host memory, checked as decode() checks them
// (validate_q_indptr, validate_tables over mla_table_view).
void validate_mla_tables(const MlaDecodeArgs& args);

// The call's table fields as a DecodeArgs of one kv head: what the GQA table checks, the split
// planner and the CPU backend's tables read.
DecodeArgs mla_table_view(const MlaDecodeArgs& args);

}  // namespace pagedattn
