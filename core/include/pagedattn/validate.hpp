// Validation shared by every backend: shapes, pointers, dtypes, and (where the tables are in
// host memory) every context length and every block id a sequence will read.
#pragma once

#include <cstdint>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

bool is_supported_head_dim(int head_dim);

// Sizes, pointers and supported configurations. Reads no tensor. The reference, which writes no
// `out`, passes require_out = false.
void validate_shapes(const DecodeArgs& args, bool require_out = true);

// context_lens and block_table given in host memory: 0 <= L_b <= max_blocks_per_seq * block_size
// and every id in the first ceil(L_b / block_size) entries of row b lies in [0, num_blocks).
void validate_tables(const DecodeArgs& args, const std::int32_t* context_lens,
                     const std::int32_t* block_table);

}  // namespace pagedattn
