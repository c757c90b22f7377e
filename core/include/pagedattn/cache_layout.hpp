// Where a token's key or value lives: the paged cache layout and the block-table view.
// A cache is a pool of num_blocks blocks, each holding block_size token slots of num_kv_heads
// heads of head_dim contiguous elements. Where the rows sit is given by three element strides
// (CacheStrides), so one code path reads the dense HND layout
// [num_blocks][num_kv_heads][block_size][head_dim] (the default), NHD
// [num_blocks][block_size][num_kv_heads][head_dim], K and V as two halves of one tensor, and a
// padded pool. docs/cache_layouts.md maps the serving engines' caches onto it.
#pragma once

#include <cstdint>

#include "pagedattn/host_device.hpp"

namespace pagedattn {

// Element strides of a K or V cache view, the same for both: between blocks, between the kv heads
// of a block and between the token slots of a kv head. All three 0 (the default) is the dense
// HND layout; otherwise all three are positive and no two rows (block, kv head, slot) overlap.
struct CacheStrides {
  std::int64_t block = 0;
  std::int64_t head = 0;
  std::int64_t token = 0;

  PAGEDATTN_HOST_DEVICE bool is_default() const { return block == 0 && head == 0 && token == 0; }

  // [num_blocks][num_kv_heads][block_size][head_dim]
  static PAGEDATTN_HOST_DEVICE CacheStrides hnd(int num_kv_heads, int block_size, int head_dim) {
    CacheStrides s;
    s.token = head_dim;
    s.head = static_cast<std::int64_t>(block_size) * head_dim;
    s.block = s.head * num_kv_heads;
    return s;
  }
  // [num_blocks][block_size][num_kv_heads][head_dim]
  static PAGEDATTN_HOST_DEVICE CacheStrides nhd(int num_kv_heads, int block_size, int head_dim) {
    CacheStrides s;
    s.head = head_dim;
    s.token = static_cast<std::int64_t>(num_kv_heads) * head_dim;
    s.block = s.token * block_size;
    return s;
  }
};

struct CacheLayout {
  std::int64_t block_stride;  // elements between consecutive blocks
  std::int64_t head_stride;   // elements between consecutive kv heads of one block
  std::int64_t token_stride;  // elements between consecutive slots of one block
  int num_blocks;
  int num_kv_heads;
  int block_size;
  int head_dim;

  // The dense layout: [num_blocks][num_kv_heads][block_size][head_dim].
  static PAGEDATTN_HOST_DEVICE CacheLayout dense(int num_blocks, int num_kv_heads, int block_size,
                                                 int head_dim) {
    CacheLayout l;
    l.token_stride = head_dim;
    l.head_stride = static_cast<std::int64_t>(block_size) * head_dim;
    l.block_stride = l.head_stride * num_kv_heads;
    l.num_blocks = num_blocks;
    l.num_kv_heads = num_kv_heads;
    l.block_size = block_size;
    l.head_dim = head_dim;
    return l;
  }

  // The layout of `strides` (the dense one when they are the default).
  static PAGEDATTN_HOST_DEVICE CacheLayout with_strides(int num_blocks, int num_kv_heads,
                                                        int block_size, int head_dim,
                                                        CacheStrides strides) {
    CacheLayout l = dense(num_blocks, num_kv_heads, block_size, head_dim);
    if (!strides.is_default()) {
      l.block_stride = strides.block;
      l.head_stride = strides.head;
      l.token_stride = strides.token;
    }
    return l;
  }

  // Element offset of slot `slot` of physical block `block`, kv head `kv_head`.
  PAGEDATTN_HOST_DEVICE std::int64_t offset(int block, int kv_head, int slot) const {
    return static_cast<std::int64_t>(block) * block_stride +
           static_cast<std::int64_t>(kv_head) * head_stride +
           static_cast<std::int64_t>(slot) * token_stride;
  }

  // Elements the pool spans: the size a cache buffer must have.
  PAGEDATTN_HOST_DEVICE std::int64_t elements() const {
    return num_blocks == 0 ? 0
                           : (num_blocks - 1) * block_stride + (num_kv_heads - 1) * head_stride +
                                 (block_size - 1) * token_stride + head_dim;
  }
};

// One row per sequence; row_stride >= max_blocks_per_seq lets a caller pass a wider table.
struct BlockTableView {
  const std::int32_t* data;
  int max_blocks_per_seq;
  int row_stride;
  // The table row each sequence reads, or null for its own: the CPU backend runs the query
  // tokens of one sequence as sequences of their own over that sequence's row.
  const std::int32_t* seq_rows = nullptr;

  PAGEDATTN_HOST_DEVICE std::int32_t block(int seq, int logical_block) const {
    return row(seq)[logical_block];
  }
  PAGEDATTN_HOST_DEVICE const std::int32_t* row(int seq) const {
    return data + static_cast<std::int64_t>(seq_rows ? seq_rows[seq] : seq) * row_stride;
  }
};

// Blocks a context of `len` tokens spans, and the valid tokens in logical block `i` of it.
// (Written without len + block_size - 1, which could overflow int near INT32_MAX.)
PAGEDATTN_HOST_DEVICE int blocks_for(int len, int block_size) {
  return len / block_size + (len % block_size != 0);
}
PAGEDATTN_HOST_DEVICE int valid_in_block(int len, int block_size, int i) {
  const int rest = len - i * block_size;
  return rest < block_size ? rest : block_size;
}

}  // namespace pagedattn
