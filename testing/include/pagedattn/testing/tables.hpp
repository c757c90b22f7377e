// Block-table generators shared by the case builders (make_case, the fuzzer's fast case) and the
// benchmark: the pool of physical blocks, rows taken from it, and which cache slots a table
// makes readable (every other slot is poisoned with NaN by the case builders).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::testing {

// The physical block ids 0 .. num_blocks - 1, in a random order when `shuffled`.
std::vector<std::int32_t> block_pool(int num_blocks, bool shuffled, std::mt19937_64& rng);

// A table of lens.size() rows of `stride` entries: row b holds the blocks_for(lens[b], block_size)
// ids that come next in `pool` (which must hold them all), and -1 after them.
std::vector<std::int32_t> table_from_pool(const std::vector<std::int32_t>& pool,
                                          const std::vector<std::int32_t>& lens, int block_size,
                                          int stride);

// One flag per cache slot (index block * block_size + slot): 1 where some sequence of `a` reads
// it (a token t < context_lens[b] in block block_table[b][t / block_size]), else 0.
std::vector<char> readable_slots(const DecodeArgs& a);

}  // namespace pagedattn::testing
