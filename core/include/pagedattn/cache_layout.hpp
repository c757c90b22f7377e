// Where a token's key or value lives: the paged cache layout and the block-table view.
// Layout (the seeds' HND): cache[num_blocks][num_kv_heads][block_size][head_dim], with explicit
// element strides so a caller's padded pool works too.
#pragma once

#include <cstdint>

#include "pagedattn/host_device.hpp"

namespace pagedattn {

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

  // Element offset of slot `slot` of physical block `block`, kv head `kv_head`.
  PAGEDATTN_HOST_DEVICE std::int64_t offset(int block, int kv_head, int slot) const {
    return block * block_stride + kv_head * head_stride + slot * token_stride;
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
