// count_shared_reads (shared_blocks.hpp): the slots each block's readers attend, as a union of
// bit sets per block id.
#include "pagedattn/shared_blocks.hpp"

#include <algorithm>
#include <bitset>
#include <unordered_map>

#include "pagedattn/pagedattn.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn {
namespace {

struct BlockReaders {
  std::bitset<kMaxBlockSize> slots;  // the union of the slots its readers attend
  int readers = 0;
};

}  // namespace

SharedBlockReads count_shared_reads(const std::int32_t* block_table, std::int64_t table_stride,
                                    const std::int32_t* context_lens, int batch, int block_size,
                                    int window_left) {
  require_block_size(block_size);
  SharedBlockReads r;
  std::unordered_map<std::int32_t, BlockReaders> blocks;
  for (int b = 0; b < batch; ++b) {
    const std::int64_t len = context_lens[b];
    const std::int64_t first = window_first_token(context_lens[b], window_left);
    r.per_sequence_tokens += len - first;
    for (std::int64_t t = first; t < len;) {
      const std::int64_t j = t / block_size;
      const std::int64_t end = std::min<std::int64_t>(len, (j + 1) * block_size);
      BlockReaders& reader = blocks[block_table[b * table_stride + j]];
      ++reader.readers;
      for (std::int64_t s = t; s < end; ++s)
        reader.slots.set(static_cast<std::size_t>(s - j * block_size));
      t = end;
    }
  }
  for (const auto& [id, reader] : blocks) {
    r.distinct_tokens += static_cast<std::int64_t>(reader.slots.count());
    if (reader.readers > 1) ++r.shared_blocks;
  }
  return r;
}

}  // namespace pagedattn
