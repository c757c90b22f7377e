// Tree masks (DecodeArgs::tree_mask): which of a sequence's new tokens a query token attends. The
// one definition shared by the f64 reference, validation and the CPU backend.
//
// Sequence b has n new tokens at positions first = L - n .. L - 1 (its query tokens). Its mask is
// n x n bits, row-major and packed little-endian from byte tree_mask_indptr[b]; query token i
// attends every token before `first` and new token j where bit (i, j) is set, j <= i.
#pragma once

#include <cstdint>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// Bit `bit` of packed bits (little-endian within each byte), read and set.
inline bool tree_mask_bit(const std::uint8_t* bits, std::int64_t bit) {
  return (bits[bit >> 3] >> (bit & 7)) & 1;
}
inline void set_tree_mask_bit(std::uint8_t* bits, std::int64_t bit) {
  bits[bit >> 3] |= static_cast<std::uint8_t>(1u << (bit & 7));
}

// One query token's row of a tree mask: the bits of new tokens 0 .. i at `bits` + `first_bit`.
struct TreeMaskRow {
  const std::uint8_t* bits = nullptr;  // null: no tree mask (the causal rule)
  std::int64_t first_bit = 0;
  int first_new = 0;  // the position of new token 0 (L - n)

  // Whether the query token attends position `pos` (at most its own position).
  bool attends(int pos) const {
    if (bits == nullptr || pos < first_new) return true;
    return tree_mask_bit(bits, first_bit + (pos - first_new));
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

// Query token i of sequence b's row of a call's tree mask (a.tree_mask null: the causal rule); the
// sequence's new tokens are its q_indptr[b + 1] - q_indptr[b] query tokens.
inline TreeMaskRow tree_mask_row(const DecodeArgs& a, int b, int i) {
  if (a.tree_mask == nullptr) return {};
  const int n = a.q_indptr[b + 1] - a.q_indptr[b];
  return tree_mask_row(a.tree_mask, a.tree_mask_indptr[b], n, i, a.context_lens[b]);
}

// Bytes a sequence of n new tokens needs: ceil(n * n / 8).
inline std::int64_t tree_mask_bytes(int n) { return (static_cast<std::int64_t>(n) * n + 7) / 8; }

// The end of the bytes of tree_mask that the masks take, given host copies of q_indptr and
// tree_mask_indptr: the largest tree_mask_indptr[b] + tree_mask_bytes(n_b), over the sequences
// before the first whose span is too short (or 0 for a negative tree_mask_indptr[0]), which is
// what validate_tree_mask reads. The last span may reach past it (and past the buffer).
inline std::int64_t tree_mask_bytes_read(int batch, const std::int32_t* q_indptr,
                                         const std::int32_t* tree_mask_indptr) {
  std::int64_t end = 0;
  if (batch <= 0 || tree_mask_indptr[0] < 0) return 0;
  for (int b = 0; b < batch; ++b) {
    const std::int64_t need = tree_mask_bytes(q_indptr[b + 1] - q_indptr[b]);
    if (static_cast<std::int64_t>(tree_mask_indptr[b + 1]) - tree_mask_indptr[b] < need) break;
    if (need > 0 && tree_mask_indptr[b] + need > end) end = tree_mask_indptr[b] + need;
  }
  return end;
}

}  // namespace pagedattn
