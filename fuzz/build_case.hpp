// Building a fuzz case: its buffers (testing::HostCase, with q and out rows at the case's
// strides and K and V in its layout), the arguments the API is called with, malformed where the
// case says so, and the error a malformed call must raise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_case.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::fuzz {

// The byte every element of out's gaps (between and after the rows of a strided out) holds before
// a call and must still hold after it. Not 0xff, the NaN poison of out's rows, so neither a stray
// NaN nor a stray value passes for it.
inline constexpr std::uint8_t kOutGapByte = 0xa5;

// The built buffers plus the (possibly malformed) arguments the API is called with.
struct BuiltCase {
  // host's q, out and lse hold one row per query token (rows of them): host.spec.batch rows
  // without multi-token queries.
  testing::HostCase host;
  int rows = 0;
  // q_indptr ([batch + 1], empty without multi-token queries) and, per row, its sequence and the
  // context it attends as a query (P + 1 for the token at position P, 0 when P < 0): what the
  // oracle checks each row against.
  std::vector<std::int32_t> q_indptr;
  std::vector<int> row_seq, row_lens;
  // Per row, the tokens it attends: its context, less those before its window and the new tokens
  // its tree mask leaves out (0: an empty row, out 0 and lse -inf or the sink).
  std::vector<int> row_attended;
  // The packed tree masks and their byte offsets ([batch + 1]) args points at, empty without a
  // tree mask (FuzzCase::tree); the bytes hold at least one, so that their pointer is not null.
  std::vector<std::uint8_t> tree_mask;
  std::vector<std::int32_t> tree_mask_indptr;
  // The host copies of the variants' per-head arrays args points at (at least num_heads values
  // for the arguments' num_heads, so a malformed head count never reads past them).
  std::vector<float> alibi_slopes, sinks;
  // The same for the per-kv-head scales of a quantized cache (at least num_kv_heads values for the
  // arguments' num_kv_heads), empty where the case has none.
  std::vector<float> k_scales, v_scales;
  // q and out as args points at them: host.q and host.out when dense, else rows of q_stride /
  // out_stride elements, each followed by its gap (the last one's too, so a write past the last
  // row shows): NaN in q, kOutGapByte in out.
  std::vector<std::uint8_t> q_rows, out_rows;  // empty where dense
  std::int64_t q_stride = 0, out_stride = 0;   // elements between rows (the row length if dense)
  // K and V in the case's layout (FuzzCase::kv_layout), poison_row's NaN (-128 in int8) in every
  // gap; empty (kv.k) for the default layout, where args reads host.k and host.v.
  testing::KvStorage kv;
  // The per-token scales args points at (FuzzCase::token_scale_layout, NaN in every gap), empty
  // without them; host.k_token_scales and v_token_scales hold them dense.
  std::vector<float> k_token_scales, v_token_scales;
  // over host's buffers (q_rows and out_rows where strided, kv's where laid out); malformed or not
  DecodeArgs args;
  ErrorCode expected_code = ErrorCode::kInvalidArgument;
  std::string expected_argument;  // empty for a valid case
  // The argument the CUDA backend raises instead (cuda_refuses_code), or empty: what it has no
  // kernel for yet (kUnsupported): a head dim (whatever the batch); else a misaligned row stride
  // (FuzzCase::cuda_misaligned_stride, over the rows args declares) or cache stride
  // (kInvalidArgument), which it checks after the shapes but before its checked-mode q_indptr,
  // tree mask, table and value checks, on a case that is valid or malformed only in those.
  std::string cuda_refuses;
  ErrorCode cuda_refuses_code = ErrorCode::kInvalidArgument;

  // The buffers args.q and args.out point at (q_rows or host.q, out_rows or host.out), gaps
  // included.
  const std::vector<std::uint8_t>& q_buffer() const { return q_rows.empty() ? host.q : q_rows; }
  std::vector<std::uint8_t>& out_buffer() { return out_rows.empty() ? host.out : out_rows; }
  const std::vector<std::uint8_t>& out_buffer() const {
    return out_rows.empty() ? host.out : out_rows;
  }
  bool laid_out() const { return !kv.k.empty(); }
  // Whether a valid case's per-token scales are read through explicit strides.
  bool token_scales_laid_out() const { return !args.token_scale_strides.is_default(); }
  // Whether row r's tree mask lets it attend the token at position t (true without a tree mask;
  // the window is not applied).
  bool tree_attends(int r, int t) const;
  // args over host's dense K and V with the default kv_strides (and its dense per-token scales with
  // the default token_scale_strides): the same attention, whatever the layout (the reference is
  // computed over it).
  DecodeArgs dense_args() const;
  // NaN in out's rows and lse (an unwritten element shows) and kOutGapByte in out's gaps.
  void poison_outputs();
};
// Throws std::invalid_argument for a case that is no case (counts, scales or strides a shrink
// step or a hand-written file broke) or whose malformation does not apply to it.
BuiltCase build_case(const FuzzCase& c);

}  // namespace pagedattn::fuzz
