// Validation of the latent cache's writes and block copies: the latent pool as mla_decode checks
// it, then what a write or copy adds, in the style of the GQA cache operations' checks.
#include "pagedattn/detail/mla_cache_validate.hpp"

#include <cstdint>
#include <string>

#include "pagedattn/detail/cache_validate.hpp"
#include "pagedattn/mla_validate.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn::detail {
namespace {

// The pool shape both operations share: mla_decode's, and slots within int32.
void validate_pool(int kv_lora_rank, int rope_dim, int block_size, int num_blocks,
                   const MlaPartStrides& c_strides, const MlaPartStrides& kpe_strides,
                   DType kv_dtype) {
  validate_mla_cache_shape(kv_lora_rank, rope_dim, block_size, num_blocks, c_strides, kpe_strides,
                           kv_dtype);
  if (static_cast<std::int64_t>(num_blocks) * block_size > INT32_MAX) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", num_blocks,
         "times block_size exceeds the int32 slot range");
  }
}

// A source row stride: 0 (dense), or at least the row's width.
void require_src_stride(const char* name, std::int64_t stride, const char* width_name, int width) {
  if (stride != 0 && stride < width) {
    fail(ErrorCode::kInvalidArgument, name, stride,
         std::string("must be 0 (dense) or at least ") + width_name + " = " +
             std::to_string(width) + ": rows must not overlap");
  }
}

}  // namespace

void validate_mla_write_args(const MlaCacheWriteArgs& a) {
  if (a.num_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "num_tokens", a.num_tokens, "must not be negative");
  }
  validate_pool(a.kv_lora_rank, a.rope_dim, a.block_size, a.num_blocks, a.c_strides, a.kpe_strides,
                a.kv_dtype);
  require_mla_kv_scale(a.kv_dtype, a.kv_scale);
  require_value_dtype("src_dtype", a.src_dtype);
  require_src_stride("kv_c_row_stride", a.kv_c_row_stride, "kv_lora_rank", a.kv_lora_rank);
  require_src_stride("k_pe_row_stride", a.k_pe_row_stride, "rope_dim", a.rope_dim);
  if (a.num_tokens == 0) return;  // a no-op: nothing is read or written
  require_non_null("kv_c", a.kv_c);
  if (a.rope_dim > 0) require_non_null("k_pe", a.k_pe);
  require_non_null("slot_mapping", a.slot_mapping);
  require_non_null("c_cache", a.c_cache);
  if (a.rope_dim > 0) require_non_null("kpe_cache", a.kpe_cache);
}

void validate_mla_slots(const MlaCacheWriteArgs& a, const std::int32_t* slot_mapping) {
  validate_write_slots(slot_mapping, a.num_tokens,
                       static_cast<std::int64_t>(a.num_blocks) * a.block_size, SlotSkip::kNegative);
}

void validate_mla_copy_args(const MlaCopyBlocksArgs& a) {
  validate_pool(a.kv_lora_rank, a.rope_dim, a.block_size, a.num_blocks, a.c_strides, a.kpe_strides,
                a.kv_dtype);
  if (a.num_pairs < 0) {
    fail(ErrorCode::kInvalidArgument, "num_pairs", a.num_pairs, "must not be negative");
  }
  if (a.num_pairs == 0) return;
  require_non_null("pairs", a.pairs);
  require_non_null("c_cache", a.c_cache);
  if (a.rope_dim > 0) require_non_null("kpe_cache", a.kpe_cache);
  validate_block_pairs(a.pairs, a.num_pairs, a.num_blocks);
}

}  // namespace pagedattn::detail
