// The DecodeArgs a libFuzzer input chooses (libfuzzer_target.cpp), valid or not: every field but
// the buffer pointers, drawn from the front of the input in a fixed order, then what the pointers
// and the per-head arrays are to be. Each draw of a later feature (the variants, the row strides,
// multi-token queries, fp8 caches, tree masks, int8 caches and per-token scales) comes after every
// earlier one and means "none" when the input has run out, so the inputs of the corpus keep their
// meaning as features are added.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::fuzz {

struct DrawnArgs {
  DecodeArgs a;  // no buffer pointers yet, but q_indptr (into indptr) and the tree mask's, drawn

  int null_pointer = 0;  // 0-6: q, k_cache, v_cache, block_table, context_lens, out, lse is null
  bool with_lse = false;
  bool single_split = false;
  // The per-head arrays: 0, 1 none; 2 valid values; 3 valid values but the one of bad_head.
  int slopes_kind = 0, sinks_kind = 0, kv_scales_kind = 0;
  int bad_head = 0;
  bool v_scales_only = false;  // per-kv-head scales for V alone (which then takes the bad one)
  std::vector<std::int32_t> indptr;
  // The tree mask's bytes, exactly as many as tree_indptr's last entry (at least one), and
  // tree_indptr ([batch + 1]), when drawn.
  std::vector<std::uint8_t> tree_bytes;
  std::vector<std::int32_t> tree_indptr;
  // Per-token scales (DecodeArgs::k_token_scales, v_token_scales; token_scale_strides is drawn in
  // `a`): 0 none; 1 both; 2 both, the element bad_row of one of them (v_bad: V's) invalid; 3 K's
  // alone; 4 V's alone.
  int token_scales_kind = 0;
  int bad_row = 0;
  bool v_bad = false;
};

// Fills `d` from the front of the input (d.a.q_indptr points into d.indptr, and the tree mask's
// pointers into d's, so `d` stays put).
void draw_args(FuzzedDataProvider& in, DrawnArgs& d);

// Elements of a shape, a negative dimension counting as 0.
inline std::size_t product(std::initializer_list<long long> dims) {
  long long p = 1;
  for (long long d : dims) p *= std::max(d, 0LL);
  return static_cast<std::size_t>(p);
}

}  // namespace pagedattn::fuzz
