// Poisoned inputs for the tests: a non-finite value planted in q or in a K row (which must give
// NaN in every head it reaches), and table entries made unreadable (which must never be read), so
// that reading any of them shows as a NaN or an out-of-bounds access.
#pragma once

#include <ostream>

#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::testing {

// Where the bad value goes, and which value.
enum class Poison {
  kQNaN,  // one element of one query head
  kQPosInf,
  kQNegInf,
  kKNaN,  // one element of a K row inside the attended tokens (one kv head)
  kKPosInf,
  kKNegInf,
  kKLastRowNaN,    // the last K row of a context that ends inside a block
  kKLastRowPosInf  // the same, +inf
};
const char* poison_name(Poison p);  // "q_nan", ..., "k_last_row_posinf"
void PrintTo(Poison p, std::ostream* os);
float poison_value(Poison p);  // NaN, +inf or -inf

// The first pool block no sequence's context owns (make_case keeps spare_blocks of them, NaN
// throughout), or c.num_blocks when every block is owned.
int unowned_block(const HostCase& c);

// Makes the first `blocks` table entries of sequence `seq` unreadable, entry i by i % 5 in turn:
// -1, an id past the pool, negative garbage, its own id with that block's K and V filled with
// NaN, or `spare`, a block no sequence owns (unowned_block).
void poison_table_entries(HostCase& c, int seq, int blocks, int spare);

// NaN in K and V of the tokens [t_begin, t_end) of sequence `seq`, every kv head.
void store_nan_tokens(HostCase& c, int seq, int t_begin, int t_end);

}  // namespace pagedattn::testing
