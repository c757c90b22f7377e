#include "pagedattn/testing/poison.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "pagedattn/cache_layout.hpp"

namespace pagedattn::testing {
namespace {

std::int32_t& table_entry(HostCase& c, int seq, int i) {
  return c.block_table[static_cast<std::size_t>(seq) * c.table_stride + i];
}

// NaN in K and V of slots [slot_begin, slot_end) of `block`, every kv head.
void store_nan_slots(HostCase& c, int block, int slot_begin, int slot_end) {
  const CacheLayout layout =
      CacheLayout::dense(c.num_blocks, c.spec.num_kv_heads, c.spec.block_size, c.spec.head_dim);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int kv = 0; kv < c.spec.num_kv_heads; ++kv) {
    for (int slot = slot_begin; slot < slot_end; ++slot) {
      const std::int64_t base = layout.offset(block, kv, slot);
      for (int d = 0; d < c.spec.head_dim; ++d) {
        store_from_float(c.k.data(), c.spec.kv_dtype, base + d, nan);
        store_from_float(c.v.data(), c.spec.kv_dtype, base + d, nan);
      }
    }
  }
}

}  // namespace

const char* poison_name(Poison p) {
  switch (p) {
    case Poison::kQNaN:
      return "q_nan";
    case Poison::kQPosInf:
      return "q_posinf";
    case Poison::kQNegInf:
      return "q_neginf";
    case Poison::kKNaN:
      return "k_nan";
    case Poison::kKPosInf:
      return "k_posinf";
    case Poison::kKNegInf:
      return "k_neginf";
    case Poison::kKLastRowNaN:
      return "k_last_row_nan";
    case Poison::kKLastRowPosInf:
      return "k_last_row_posinf";
  }
  return "?";
}

void PrintTo(Poison p, std::ostream* os) { *os << poison_name(p); }

float poison_value(Poison p) {
  switch (p) {
    case Poison::kQPosInf:
    case Poison::kKPosInf:
    case Poison::kKLastRowPosInf:
      return std::numeric_limits<float>::infinity();
    case Poison::kQNegInf:
    case Poison::kKNegInf:
      return -std::numeric_limits<float>::infinity();
    default:
      return std::numeric_limits<float>::quiet_NaN();
  }
}

int unowned_block(const HostCase& c) {
  std::vector<char> owned(c.num_blocks, 0);
  for (int b = 0; b < c.spec.batch; ++b) {
    for (int i = 0; i < blocks_for(c.context_lens[b], c.spec.block_size); ++i) {
      owned[c.block_table[static_cast<std::size_t>(b) * c.table_stride + i]] = 1;
    }
  }
  return static_cast<int>(std::find(owned.begin(), owned.end(), 0) - owned.begin());
}

void poison_table_entries(HostCase& c, int seq, int blocks, int spare) {
  for (int i = 0; i < blocks; ++i) {
    std::int32_t& id = table_entry(c, seq, i);
    switch (i % 5) {
      case 0:
        id = -1;
        break;
      case 1:
        id = c.num_blocks + 1000 + i;
        break;
      case 2:
        id = -500000 - i;
        break;
      case 3:
        store_nan_slots(c, id, 0, c.spec.block_size);
        break;
      default:
        id = spare;
        break;
    }
  }
}

void store_nan_tokens(HostCase& c, int seq, int t_begin, int t_end) {
  const int BS = c.spec.block_size;
  for (int t = t_begin; t < t_end; ++t) {
    store_nan_slots(c, table_entry(c, seq, t / BS), t % BS, t % BS + 1);
  }
}

}  // namespace pagedattn::testing
