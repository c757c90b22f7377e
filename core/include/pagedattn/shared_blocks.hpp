// What a decode step reads when every cache block is read once for all the sequences whose block
// tables hold it: the bound that reading shared prefixes once reaches. Forked sequences
// (BlockManager::fork: n-way sampling, beam search, a shared system prompt) hold the same
// physical blocks at the start of their tables, and a plain decode reads those blocks once per
// sequence.
#pragma once

#include <cstdint>

namespace pagedattn {

struct SharedBlockReads {
  // Tokens the step attends, summed over the sequences (each sequence reads its own).
  std::int64_t per_sequence_tokens = 0;
  // Distinct (block, slot) pairs among those: the tokens read with each block read once.
  std::int64_t distinct_tokens = 0;
  // Blocks that two or more of the sequences attend to.
  std::int64_t shared_blocks = 0;
};

// Counts the reads of one decode step over host block tables (DecodeArgs::block_table, row b at
// b * table_stride, and context_lens): each sequence attends its last min(len, window_left + 1)
// tokens (window_first_token; window_left < 0: all of them). The tables must be valid for the
// lengths (every entry a sequence reads is a block id >= 0; validate_tables checks it); block ids
// need not be below any bound. block_size is checked as decode checks it (require_block_size).
SharedBlockReads count_shared_reads(const std::int32_t* block_table, std::int64_t table_stride,
                                    const std::int32_t* context_lens, int batch, int block_size,
                                    int window_left = -1);

}  // namespace pagedattn
