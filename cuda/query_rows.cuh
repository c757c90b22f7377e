// The rows of multi-token queries on the device (DecodeArgs::q_indptr): which rows of q, out and
// lse a sequence owns, what query head and query token each of a CTA's rows is, and the mask
// that tells the tokens of a sequence's query tokens apart. Query token i of n sits
// back = n - 1 - i positions before the last one (at L - 1) and attends to the tokens up to its
// own position, within its own window; with a tree mask (DecodeArgs::tree_mask), of the new
// tokens L - n .. L - 1 only those its mask row keeps.
#pragma once

#include "split_params.cuh"

namespace pagedattn::detail::cuda {

struct SeqQueries {
  int row0, n;  // the first row of q / out / lse, and the query tokens
};

// Sequence b's rows, clamped into [0, q_rows) and to at most max_q tokens: a corrupt q_indptr
// (unchecked mode) never sends a read or write outside q, out, lse or the partial states.
__device__ __forceinline__ SeqQueries seq_queries(const std::int32_t* q_indptr, int q_rows,
                                                  int max_q, int b) {
  if (q_indptr == nullptr) return {b, 1};
  const int r0 = min(max(__ldg(q_indptr + b), 0), q_rows);
  const int r1 = min(max(__ldg(q_indptr + b + 1), r0), q_rows);
  return {r0, min(r1 - r0, max_q)};
}
__device__ __forceinline__ SeqQueries seq_queries(const SplitParams& p, int b) {
  return seq_queries(p.q_indptr, p.q_rows, p.max_q, b);
}

// Row lr of a CTA (valid below item.rows; an invalid row aliases row 0 and is never stored).
struct QueryRow {
  int head;  // query head
  int qrow;  // row of q, out and lse
  int back;  // positions before the last query token
  bool valid;
};

// kMulti: the sequence may have several query tokens (item.n_q > 1); without, a row is a head of
// the group and no division is needed.
template <bool kMulti = true>
__device__ __forceinline__ QueryRow query_row(const SplitParams& p, const CtaItem& item, int lr) {
  QueryRow o;
  o.valid = lr < item.rows;
  const int r = item.row_begin + (o.valid ? lr : 0);
  const int tok = kMulti ? r / p.group : 0;
  o.head = item.kv * p.group + (r - tok * p.group);
  o.qrow = item.q_row0 + tok;
  o.back = item.n_q - 1 - tok;
  return o;
}

// Whether the row `back` positions before the last query (at last_pos) attends to token t.
__device__ __forceinline__ bool row_attends(int t, int last_pos, int back, int window_left) {
  const int pos = last_pos - back;
  return t <= pos && (window_left < 0 || t >= pos - window_left);
}

// Whether the rows of a sequence may disagree on tokens [lo, hi]: only then do the kernels test
// each row (the tile mask covers the rest: tokens from the earliest query's window to L - 1).
// n is disagree_tokens: causal rows agree up to the first query token's position.
__device__ __forceinline__ bool rows_disagree(int lo, int hi, int last_pos, int n,
                                              int window_left) {
  return n > 1 && (hi > last_pos - (n - 1) || (window_left >= 0 && lo < last_pos - window_left));
}

// The query tokens rows_disagree weighs for a sequence of n_q: n_q, or with a tree mask one more,
// since a tree row may drop any new token, the first one and a single query's own included.
__device__ __forceinline__ int disagree_tokens(const SplitParams& p, int n_q) {
  return n_q + (p.tree_mask != nullptr ? 1 : 0);
}

// The byte offset of the item's sequence's mask in tree_mask, or -1 where its rows keep every
// new token up to their own: no tree mask, or a span [tree_mask_indptr[b], tree_mask_indptr[b +
// 1]) too short for its n_q x n_q bits (checked mode refuses such a span; unchecked mode reads
// nothing outside the spans). Read once per item.
__device__ __forceinline__ int tree_mask_at(const SplitParams& p, const CtaItem& item) {
  if (p.tree_mask == nullptr) return -1;
  const int at = __ldg(p.tree_mask_indptr + item.seq);
  const int end = __ldg(p.tree_mask_indptr + item.seq + 1);
  const long long n = item.n_q;
  if (at < 0 || static_cast<long long>(end) - at < (n * n + 7) / 8) return -1;
  return at;
}

// Whether the row `back` positions before the last of the sequence's n_q query tokens keeps new
// token j under the mask at byte `at` (tree_mask_at; -1: every one); a token before the new ones
// (j < 0) is always kept. Bit (i, j) is bit i * n_q + j, packed little-endian. Out of line: the
// CUDA-core path tests every token, and inlined there its 64-bit arithmetic raised that build's
// registers past three CTAs per SM.
inline __device__ __noinline__ bool tree_keeps(const SplitParams& p, int at, int n_q, int back,
                                               int j) {
  if (at < 0 || j < 0) return true;
  const long long bit =
      static_cast<long long>(at) * 8 + static_cast<long long>(n_q - 1 - back) * n_q + j;
  return (__ldg(p.tree_mask + (bit >> 3)) >> (bit & 7)) & 1u;
}

// tree_keeps for the 16 new tokens j0 .. j0 + 15 at once: bit k for token j0 + k (set for tokens
// before the new ones), read a byte at a time (at most 3) and never past the mask's last byte.
// Bits for tokens after the row's own position are whatever the mask holds there.
__device__ __forceinline__ unsigned tree_keeps16(const SplitParams& p, int at, int n_q, int back,
                                                 int j0) {
  if (at < 0 || j0 <= -16) return 0xffffu;
  const int lead = j0 < 0 ? -j0 : 0;  // tokens before the new ones
  const long long row =
      static_cast<long long>(at) * 8 + static_cast<long long>(n_q - 1 - back) * n_q;
  const long long first = row + j0 + lead;  // bit of new token max(j0, 0)
  const long long end = static_cast<long long>(at) * 8 + static_cast<long long>(n_q) * n_q;
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const long long byte = (first >> 3) + k;
    if (byte * 8 < end) bits |= static_cast<unsigned>(__ldg(p.tree_mask + byte)) << (8 * k);
  }
  bits >>= first & 7;
  return ((bits << lead) | ((1u << lead) - 1u)) & 0xffffu;
}

}  // namespace pagedattn::detail::cuda
