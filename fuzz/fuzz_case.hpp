// One fuzz case: a random-case spec plus what the fuzzer adds on top of it (exact-logit snapping,
// a custom scale, the CPU thread count, the attention variants, q and out row strides, multi-token
// queries and their tree masks, the K/V cache layout, quantized (fp8 and int8) caches and their
// scales, a planted malformation). Every case
// is a pure function of (seed, index) and the draw options (draw_case.hpp), and a case file holds
// the full description (case_file.hpp) so a shrunk case replays alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "malformation.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::fuzz {

// The dtypes a case draws for q, out and a plain cache, and for a quantized cache.
inline constexpr DType kPlainDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
// int4 last: a head dim that is not a multiple of 32 draws among the others.
inline constexpr DType kQuantizedDTypes[] = {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8,
                                             DType::kInt4};

// Where a case's per-token scales live (DecodeArgs::token_scale_strides, a cache view's strides
// with head_dim 1): kDense is the default [num_blocks][num_kv_heads][block_size], strides left 0;
// kNhd is [num_blocks][block_size][num_kv_heads]; kPadded is the dense order given explicitly,
// with token_scale_pad elements of gap after every row, kv head and block (pad 0: the dense
// strides themselves, nonzero).
enum class TokenScaleLayout { kDense, kNhd, kPadded };
inline constexpr TokenScaleLayout kAllTokenScaleLayouts[] = {
    TokenScaleLayout::kDense, TokenScaleLayout::kNhd, TokenScaleLayout::kPadded};
const char* token_scale_layout_name(TokenScaleLayout layout);  // "dense", "nhd", "padded"

struct FuzzCase {
  testing::CaseSpec spec;
  // q and k snapped to integers in [-127, 127] and a power-of-two scale: every logit is exact in
  // f32 whatever the summation order, so huge logits compare tightly.
  bool snap = false;
  float scale = 0.f;  // 0: the default 1 / sqrt(head_dim)
  int threads = 1;    // CPU backend threads (the split plan depends on them)
  // The attention variants (DecodeArgs; pagedattn/variants.hpp). With a window and poison, the
  // table entries before each sequence's first attended block hold -1 or garbage and the slots
  // of unattended tokens NaN, like everything past a context.
  int window_left = -1;
  float soft_cap = 0.f;
  std::vector<float> alibi_slopes;  // empty: none; else one per query head
  std::vector<float> sinks;         // empty: none; else one per query head (-inf: no sink)
  // Row strides of q and out in elements (DecodeArgs::q_row_stride, out_row_stride); 0: dense.
  // A strided q holds NaN between its rows (a read of them shows in out), a strided out
  // kOutGapByte (a write to them shows in the gap check).
  std::int64_t q_row_stride = 0;
  std::int64_t out_row_stride = 0;
  // Multi-token queries (DecodeArgs::q_indptr). max_q_len 0: none, one query token per sequence
  // (q_lens empty). Else q_lens holds each sequence's query tokens (0 allowed, and more than its
  // context), and max_q_len, at least their largest, is the declared bound.
  std::vector<int> q_lens;
  int max_q_len = 0;
  // Tree masks (DecodeArgs::tree_mask, tree_mask_indptr), for multi-token cases only: with `tree`,
  // tree_masks holds one mask per sequence, q_lens[b]^2 characters '0' or '1' row-major (query
  // token i attends new token j where tree_masks[b][i * q_lens[b] + j] is '1'), all '0' above the
  // diagonal. tree_pack_seed 0 packs them back to back from byte 0, every bit past a mask clear;
  // any other value draws from it a first offset above 0, padding bytes of garbage between the
  // masks and garbage in the bits past each mask's last one, all of which must be ignored.
  bool tree = false;
  std::vector<std::string> tree_masks;
  std::uint64_t tree_pack_seed = 0;
  // Where K and V live (testing::KvLayout, DecodeArgs::kv_strides): kHnd is the default dense
  // layout, kv_strides left 0; any other is the case's K and V copied there, NaN in every gap.
  // kv_pad (kPaddedHnd only) widens every row's gap by that many elements, the kv head and block
  // strides following: strides that need not be multiples of 16 bytes, which the CPU backend
  // takes and the CUDA backend refuses (cuda_misaligned_kv).
  testing::KvLayout kv_layout = testing::KvLayout::kHnd;
  int kv_pad = 0;
  // Quantized caches (spec.kv_dtype kFP8E4M3, kFP8E5M2 or kInt8) take their dequantization
  // scales from spec.k_scale and spec.v_scale, and per kv head from k_scales and v_scales (empty:
  // none; else num_kv_heads values each). The codes hold the case's values divided by the scales,
  // so the values the attention sees have the usual spread. Other caches keep the scales at 1 and
  // none per head (spec.per_head_scales is not used: make_fast_case takes the arrays themselves).
  std::vector<float> k_scales, v_scales;
  // Per-token scales (DecodeArgs::k_token_scales, v_token_scales), quantized caches only: with
  // spec.token_scales, make_fast_case gives every cache row (block, kv head, slot) a K and a V
  // scale of its own (fitted to the row's values, fast_case.hpp), and build_case stores them in
  // token_scale_layout, NaN in every gap. token_scale_pad: kPadded only, 0 to 4096.
  TokenScaleLayout token_scale_layout = TokenScaleLayout::kDense;
  int token_scale_pad = 0;
  Malformation bad = Malformation::kNone;
  std::uint64_t bad_param = 0;  // which sequence / entry / pointer / value the malformation uses
  // Where the case came from (informational once shrunk).
  std::uint64_t origin_seed = 0;
  std::uint64_t origin_index = 0;

  bool malformed() const { return bad != Malformation::kNone; }
  bool huge() const { return spec.magnitude >= 4.f; }
  bool windowed() const { return window_left >= 0; }
  bool soft_capped() const { return soft_cap > 0.f; }
  // The variants context_parallel_decode refuses (a position in the whole sequence, or a term
  // counted once per sequence); the soft-cap it runs.
  bool position_variants() const { return windowed() || !alibi_slopes.empty() || !sinks.empty(); }
  bool multi_token() const { return max_q_len > 0; }
  // Whether query token i of sequence b attends new token j (the sequence's tree mask).
  bool tree_bit(int b, int i, int j) const {
    const std::size_t n = static_cast<std::size_t>(q_lens[static_cast<std::size_t>(b)]);
    return tree_masks[static_cast<std::size_t>(b)]
                     [static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j)] == '1';
  }
  // Rows of q, out and lse: every query token (the sum of q_lens), or one per sequence.
  int q_rows() const;
  // The stride field the CUDA backend refuses, or null: with two rows or more, q's rows must
  // start 16-byte aligned (it reads them in 16-byte pieces) and out's at even elements (it stores
  // them two at a time); q is checked first. The CPU backend takes any stride.
  const char* cuda_misaligned_stride() const;
  bool default_layout() const { return kv_layout == testing::KvLayout::kHnd && kv_pad == 0; }
  bool fp8() const { return is_fp8(spec.kv_dtype); }
  bool quantized() const { return is_quantized(spec.kv_dtype); }
  bool per_head_scales() const { return !k_scales.empty() || !v_scales.empty(); }
  bool token_scales() const { return spec.token_scales; }
  // DecodeArgs::token_scale_strides for the layout (all 0 for kDense).
  CacheStrides token_scale_strides() const;
  // The layout's geometry for this case's shapes and `num_blocks` blocks (kv_pad applied).
  testing::KvGeometry kv_geometry(int num_blocks) const;
  // The kv_strides field the CUDA backend refuses, or null: it reads cache rows in 16-byte
  // pieces, so every stride must be a multiple of 16 bytes (checked block, head, token, after the
  // q and out row strides). Only a kv_pad can break that; the default layout never does.
  const char* cuda_misaligned_kv() const;
};

// Each tree mask fitted to its sequence's count (after an edit of q_lens): the leading n x n
// corner of a larger mask (still lower-triangular), a smaller one extended by new rows that
// attend their own token alone. A case without a tree mask is left as it is.
void fit_tree_masks(FuzzCase& c);

// One line: the spec and every feature the case sets.
std::string describe(const FuzzCase& c);

}  // namespace pagedattn::fuzz
