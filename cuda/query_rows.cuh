// The rows of multi-token queries on the device (DecodeArgs::q_indptr): which rows of q, out and
// lse a sequence owns, what query head and query token each of a CTA's rows is, and the causal
// mask that tells the tokens of a sequence's query tokens apart. Query token i of n sits
// back = n - 1 - i positions before the last one (at L - 1) and attends to the tokens up to its
// own position, within its own window.
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

// Whether the rows of a sequence with n_q query tokens may disagree on tokens [lo, hi]: only
// then do the kernels test each row (the tile mask covers the rest: tokens from the earliest
// query's window to L - 1).
__device__ __forceinline__ bool rows_disagree(int lo, int hi, int last_pos, int n_q,
                                              int window_left) {
  return n_q > 1 &&
         (hi > last_pos - (n_q - 1) || (window_left >= 0 && lo < last_pos - window_left));
}

}  // namespace pagedattn::detail::cuda
