// The fuzzer's case builder: the same layout and the same traps as testing::make_case (a
// permuted oversized pool, prefix sharing, -1 and garbage past each context, NaN (poison_row) in
// every slot no sequence reads), with a generator cheap enough for thousands of cases a minute, and
// two traps more: stale in-range ids past a context and prefixes shared with any earlier sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::fuzz {

// `n` elements of dtype `t` that no backend may read: NaN, or in an int8 cache, which holds no NaN
// (its conversion makes NaN 0), the code -128, which no write ever stores (codes are -127..127)
// and which dequantizes to a value off the case's spread, so that a read of it shows as a wrong
// result where it cannot show as NaN.
std::vector<std::uint8_t> poison_row(DType t, int n);

// The per-token scale of a row that validate_token_scales checks but no sequence reads (see
// make_fast_case), where NaN would be refused: the largest power of two it takes (2^99, about
// 6.3e29, within kMaxKvScale), so that a read of the row dwarfs every other value or overflows,
// and a snapped case's scales all stay powers of two.
inline constexpr float kCheckedUnreadScale = 0x1p99f;

// The first token any of a sequence's q_len query tokens reads, for a context of L tokens: the
// window's first token of its earliest query at a position of 0 or more (L - q_len, or 0 when the
// queries start before the context), or L (nothing) without query tokens. Computed from a
// non-negative context, so that a window_left near INT32_MAX cannot overflow `L - 1 -
// window_left` (as queries_first_token(L, q_len, window_left) does when q_len > L + 1).
int first_read_token(int L, int window_left, int q_len);

// window_left >= 0: the case is decoded with that sliding window, so with poison the traps cover
// what the window leaves unread as well: the table entries before each sequence's first attended
// block get -1 or garbage ids, and every slot only unattended tokens map to gets NaN.
// q_lens (non-empty): multi-token queries, q_lens[b] query tokens for sequence b (DecodeArgs::
// q_indptr): q, out and lse get one row per query token, and what no query token reads is trapped
// alike: the entries before the block of the earliest query's first attended token, and the
// whole row of a sequence without query tokens.
// k_scales, v_scales (quantized caches; empty or num_kv_heads values each): the per-head scales,
// kept in the case (HostCase::k_scales, v_scales). A quantized cache stores each value divided by
// its scale (spec.k_scale times the kv head's k_scales entry for K, likewise for V), so the values
// the attention sees have the same spread as in any other cache.
// tree_masks (with q_lens; empty or one per sequence, as FuzzCase::tree_masks): the new tokens no
// query token's mask row names are not read either, so with poison their slots get NaN too.
// spec.token_scales (quantized caches): every row (block, kv head, slot) also gets a K and a V
// scale of its own (HostCase::k_token_scales, v_token_scales, dense [num_blocks][num_kv_heads]
// [block_size]), fitted to the row's values: its largest |value| / scales lands on a code of 32 to
// 127, in every format (int8's range, where an int8 row of write_cache's lands; snapped codes keep
// it). With poison, the scales of a row no sequence reads are NaN like its codes, except where
// validate_token_scales checks them all the same (every slot below a context in the blocks its
// sequence reads: before a window's first token, or new tokens no tree mask row names):
// kCheckedUnreadScale there.
testing::HostCase make_fast_case(const testing::CaseSpec& spec, int window_left = -1,
                                 const std::vector<int>& q_lens = {},
                                 const std::vector<float>& k_scales = {},
                                 const std::vector<float>& v_scales = {},
                                 const std::vector<std::string>& tree_masks = {});

}  // namespace pagedattn::fuzz
