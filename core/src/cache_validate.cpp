// Validation of the cache-write entry points, shared by both backends.
#include "pagedattn/detail/cache_validate.hpp"

#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_set>

#include "pagedattn/validate.hpp"

namespace pagedattn {
namespace {

// The pool shape both operations share.
void validate_pool(int num_kv_heads, int head_dim, int block_size, int num_blocks) {
  require_positive("num_kv_heads", num_kv_heads);
  require_head_dim(head_dim);  // a pool decode() cannot read is refused as decode() refuses it
  require_block_size(block_size);
  if (num_blocks < 0) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", num_blocks, "must not be negative");
  }
  if (static_cast<std::int64_t>(num_blocks) * block_size > INT32_MAX) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", num_blocks,
         "times block_size exceeds the int32 slot range");
  }
}

}  // namespace

namespace detail {

void validate_write_args(const CacheWriteArgs& a) {
  if (a.num_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "num_tokens", a.num_tokens, "must not be negative");
  }
  validate_pool(a.num_kv_heads, a.head_dim, a.block_size, a.num_blocks);
  require_cache_strides(a.kv_strides, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  require_value_dtype("src_dtype", a.src_dtype);
  require_dtype("cache_dtype", a.cache_dtype);
  require_cache_scales("cache_dtype", a.cache_dtype, a.k_scale, a.v_scale, a.k_scales, a.v_scales);
  require_int4_cache(a.cache_dtype, a.head_dim, a.kv_strides);
  require_token_scales("cache_dtype", a.cache_dtype, a.k_token_scales, a.v_token_scales,
                       a.token_scale_strides, a.num_blocks, a.num_kv_heads, a.block_size,
                       a.head_dim);
  if (a.src_token_stride != 0 &&
      a.src_token_stride < static_cast<std::int64_t>(a.num_kv_heads) * a.head_dim) {
    std::ostringstream v;
    v << a.src_token_stride
      << " (num_kv_heads * head_dim = " << static_cast<std::int64_t>(a.num_kv_heads) * a.head_dim
      << ")";
    fail(ErrorCode::kInvalidArgument, "src_token_stride", v.str(),
         "must be 0 or at least num_kv_heads * head_dim");
  }
  if (a.num_tokens == 0) return;  // a no-op: nothing is read or written
  require_non_null("key", a.key);
  require_non_null("value", a.value);
  require_non_null("slot_mapping", a.slot_mapping);
  require_non_null("k_cache", a.k_cache);
  require_non_null("v_cache", a.v_cache);
}

void validate_copy_args(const CopyBlocksArgs& a) {
  validate_pool(a.num_kv_heads, a.head_dim, a.block_size, a.num_blocks);
  require_cache_strides(a.kv_strides, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  require_dtype("cache_dtype", a.cache_dtype);
  require_int4_cache(a.cache_dtype, a.head_dim, a.kv_strides);
  require_token_scales("cache_dtype", a.cache_dtype, a.k_token_scales, a.v_token_scales,
                       a.token_scale_strides, a.num_blocks, a.num_kv_heads, a.block_size,
                       a.head_dim);
  if (a.num_pairs < 0) {
    fail(ErrorCode::kInvalidArgument, "num_pairs", a.num_pairs, "must not be negative");
  }
  if (a.num_pairs == 0) return;
  require_non_null("pairs", a.pairs);
  require_non_null("k_cache", a.k_cache);
  require_non_null("v_cache", a.v_cache);
  validate_block_pairs(a.pairs, a.num_pairs, a.num_blocks);
}

void validate_block_pairs(const BlockCopy* pairs, int num_pairs, int num_blocks) {
  const auto check_id = [&](int i, const char* field, std::int32_t id) {
    if (id < 0 || id >= num_blocks) {
      std::ostringstream arg;
      arg << "pairs[" << i << "]." << field;
      fail(ErrorCode::kOutOfRange, arg.str(), id,
           "block id out of range [0, " + std::to_string(num_blocks) + ") (num_blocks)");
    }
  };
  std::unordered_set<std::int32_t> srcs, dsts;
  for (int i = 0; i < num_pairs; ++i) {
    check_id(i, "src", pairs[i].src);
    check_id(i, "dst", pairs[i].dst);
    srcs.insert(pairs[i].src);
  }
  // Pairs run in parallel: a block written twice, or written while another pair reads it, would
  // make the result depend on the order.
  for (int i = 0; i < num_pairs; ++i) {
    const std::int32_t dst = pairs[i].dst;
    if (!dsts.insert(dst).second || srcs.count(dst)) {
      std::ostringstream arg;
      arg << "pairs[" << i << "].dst";
      fail(ErrorCode::kInvalidArgument, arg.str(), dst,
           srcs.count(dst) ? "is also the src of a pair" : "appears as the dst of two pairs");
    }
  }
}

void validate_slots(const CacheWriteArgs& a, const std::int32_t* slot_mapping) {
  validate_slot_mapping(a, slot_mapping);
}

void validate_write_scales(const CacheWriteArgs& a, const float* k_scales, const float* v_scales) {
  for (int h = 0; h < a.num_kv_heads; ++h) {
    if (k_scales != nullptr) {
      require_kv_scale(("k_scales[" + std::to_string(h) + "]").c_str(), k_scales[h]);
    }
    if (v_scales != nullptr) {
      require_kv_scale(("v_scales[" + std::to_string(h) + "]").c_str(), v_scales[h]);
    }
  }
}

}  // namespace detail

}  // namespace pagedattn
