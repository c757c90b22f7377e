// Tree masks (DecodeArgs::tree_mask): which of a sequence's new tokens a query token attends. The
// one definition shared by the f64 reference, validation and the CPU backend.
//
// Sequence b has n new tokens at positions first = L - n .. L - 1 (its query tokens). Its mask is
// n x n bits, row-major and packed little-endian from byte tree_mask_indptr[b]; query token i
// attends every token before `first` and new token j where bit (i, j) is set, j <= i.
#pragma once

#include <cstdint>

namespace pagedattn {

// One query token's row of a tree mask: the bits of new tokens 0 .. i at `bits` + `first_bit`.
struct TreeMaskRow {
  const std::uint8_t* bits = nullptr;  // null: no tree mask (the causal rule)
  std::int64_t first_bit = 0;
  int first_new = 0;  // the position of new token 0 (L - n)

  // Whether the query token attends position `pos` (at most its own position).
  bool attends(int pos) const {
    if (bits == nullptr || pos < first_new) return true;
    const std::int64_t bit = first_bit + (pos - first_new);
    return (bits[bit >> 3] >> (bit & 7)) & 1;
  }
};

// Query token i's row in a mask of n x n bits starting at byte `byte_offset`, for a sequence of
// context `len` (null `mask`: the causal rule).
inline TreeMaskRow tree_mask_row(const std::uint8_t* mask, std::int64_t byte_offset, int n, int i,
                                 int len) {
  TreeMaskRow r;
  r.bits = mask;
  r.first_bit = byte_offset * 8 + static_cast<std::int64_t>(i) * n;
  r.first_new = len - n;
  return r;
}

// Bytes a sequence of n new tokens needs: ceil(n * n / 8).
inline std::int64_t tree_mask_bytes(int n) { return (static_cast<std::int64_t>(n) * n + 7) / 8; }

}  // namespace pagedattn
