// The CPU backend's work-item kernel, one instantiation per instruction set (isa_*.cpp), chosen
// once at run time through xsimd::dispatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/variants.hpp"

// The processors with kernels: x86-64 (SSE2, AVX2, AVX-512; isa_sse2/avx2/avx512.cpp) and
// AArch64 (NEON, its baseline; isa_neon.cpp). cpu/CMakeLists.txt refuses any other.
#if defined(__x86_64__) || defined(_M_X64)
#define PAGEDATTN_CPU_X86 1
#define PAGEDATTN_CPU_ARM64 0
#elif defined(__aarch64__) || defined(_M_ARM64)
#define PAGEDATTN_CPU_X86 0
#define PAGEDATTN_CPU_ARM64 1
#else
#error "pagedattn's CPU backend has kernels for x86-64 and AArch64 only"
#endif

namespace pagedattn::detail::cpu {

// Everything a work item reads. q_scaled is q widened to f32 and multiplied by the scale; the
// AVX-512 BF16 kernel takes Q.K from the caller's bf16 q instead (q_bf16, set only when q is
// bf16), multiplying the dot products by scale.
struct ItemContext {
  const float* q_scaled;           // [batch][num_heads][head_dim]
  const bf16_t* q_bf16 = nullptr;  // the caller's q: rows of q_bf16_stride elements, or null
  std::int64_t q_bf16_stride = 0;
  float scale = 1.f;
  // An fp8 cache's K scales (DecodeArgs::k_scale, k_scales), for the bf16 q's dot products.
  float k_scale = 1.f;
  const float* k_scales = nullptr;
  // The weights may enter P.V rounded to bf16 (the out dtype is bf16, whose final rounding is as
  // coarse): the AVX-512 BF16 kernel then multiplies P.V of a bf16 cache with vdpbf16ps, as the
  // CUDA tensor-core path does.
  bool bf16_weights = false;
  const void* k_cache;
  const void* v_cache;
  DType kv_dtype;
  // The caches' layout in storage units: elements, but bytes for int4 (int4x2_t, two codes each),
  // head_dim still counting values.
  CacheLayout layout;
  // A quantized cache's per-token scales (DecodeArgs::k_token_scales), or null, and where each
  // row's is (an int4 row's head_dim / 32 group scales from there on).
  const float* k_token_scales = nullptr;
  const float* v_token_scales = nullptr;
  CacheLayout token_scale_layout{};
  BlockTableView table;
  const std::int32_t* context_lens;
  int num_heads;
  int group_size;
  // Query tokens together (decode_cpu.cpp): each sequence's rows of a kv head are its query
  // tokens times the group, token i's token_group heads at rows [i * token_group, (i + 1) *
  // token_group), and token i of sequence b's n_b = q_indptr[b + 1] - q_indptr[b] attends the
  // context up to position L - n_b + i. token_group 0: one query token per sequence.
  int token_group = 0;
  const std::int32_t* q_indptr = nullptr;
  // Tree masks (DecodeArgs::tree_mask), one query token per sequence: sequence s attends the
  // tokens tree_rows[s].attends() (every token before its new ones, the new ones its mask row
  // names); its masked tokens' K and V are never read. Null: no tree mask.
  const TreeMaskRow* tree_rows = nullptr;
  // Tree masks with the query tokens together (token_group > 0): the call's masks and their
  // byte offsets (DecodeArgs::tree_mask, tree_mask_indptr), or null.
  const std::uint8_t* tree_mask = nullptr;
  const std::int32_t* tree_mask_indptr = nullptr;
  // The attention variants (pagedattn/variants.hpp); the plan already starts each sequence at
  // its window's first block.
  int window_left = -1;
  float soft_cap = 0.f;                 // 0: none
  const float* alibi_slopes = nullptr;  // [num_heads], or null
  // Shared prefixes (DecodeOptions::share_prefixes): sequence s's tokens before first_tokens[s]
  // were decoded with its group (decode_cpu.cpp), so its items start there; the plan's items begin
  // at that token's block. Null: none.
  const std::int32_t* first_tokens = nullptr;

  // Whether the kernel reads the cache as dequantized f32 rows (dequantize_rows.hpp) rather than
  // widening its codes in registers: int8 and int4 caches, and caches with per-token scales.
  bool dequantizes() const {
    return kv_dtype == DType::kInt8 || kv_dtype == DType::kInt4 || k_token_scales != nullptr;
  }
};

// The backend's context for a call's work items (decode_cpu.cpp builds every call's this way):
// a's caches, table, scales and variants over q_scaled, the weights rounded to bf16 for a bf16
// out. Sequence b reads table row seq_rows[b] (null: row b).
ItemContext item_context(const DecodeArgs& a, const float* q_scaled,
                         const std::int32_t* seq_rows = nullptr);

// The causal bounds of a sequence's query tokens taken together (ItemContext::token_group):
// row r of a kv head's rows is query token r / token_group's, which attends positions up to
// first_query_pos + its index; rows of padding tokens (index n and on) attend the whole context.
// With a tree mask (`tree`, ItemContext::tree_mask) a token attends, of the new tokens, only
// those its mask row keeps. With token_group 0 (one query token) n is 1 and first_query_pos
// L - 1; last_pos and keeps are not called.
struct QueryBounds {
  int n = 1;                // the sequence's query tokens
  int first_query_pos = 0;  // the position of its first one
  int token_group = 0;
  int context = 0;                     // L
  const std::uint8_t* tree = nullptr;  // the sequence's mask (its first byte), or null
  // The last position that row `row` of a kv head's rows attends.
  int last_pos(int row) const {
    const int i = row / token_group;
    return i < n ? first_query_pos + i : context - 1;
  }
  // Whether row `row` keeps position pos under the tree mask (positions up to its last_pos).
  bool keeps(int row, int pos) const {
    const int i = row / token_group;
    if (tree == nullptr || pos < first_query_pos || i >= n) return true;
    return tree_mask_bit(tree, static_cast<std::int64_t>(i) * n + (pos - first_query_pos));
  }
  // Whether any query token keeps new token position pos (at or before its own position).
  bool any_keeps(int pos) const {
    for (int i = pos - first_query_pos; i < n; ++i) {
      if (keeps(i * token_group, pos)) return true;
    }
    return false;
  }
};
// The first token sequence seq of context L computes: its window's first, or later where its
// shared prefix ends (ItemContext::first_tokens).
inline int first_computed_token(const ItemContext& c, int seq, int L) {
  const int first = window_first_token(L, c.window_left);
  return c.first_tokens != nullptr ? std::max(first, c.first_tokens[seq]) : first;
}

inline QueryBounds query_bounds(const ItemContext& c, int seq, int context) {
  QueryBounds b;
  b.n = c.token_group > 0 ? c.q_indptr[seq + 1] - c.q_indptr[seq] : 1;
  b.first_query_pos = context - b.n;
  b.token_group = c.token_group;
  b.context = context;
  if (c.token_group > 0 && c.tree_mask != nullptr) b.tree = c.tree_mask + c.tree_mask_indptr[seq];
  return b;
}

// What the variants do to the logits of one block for a tile of heads: the soft-cap, then the
// ALiBi bias slope_r * pos, pos = first_pos + t for the block's t-th computed token.
// With several query tokens of a sequence in the tile, rows_n[r] is the number of the block's
// computed tokens head r attends (a prefix: its causal bound), null when every head attends all.
struct BlockLogits {
  float cap = 0.f;                // 0: none
  const float* slopes = nullptr;  // the tile's first head's slope, or null
  int first_pos = 0;              // position of the first computed token minus (L - 1)
  const int* rows_n = nullptr;
  bool active() const { return cap > 0.f || slopes != nullptr; }
};

// The stretches of a block's computed tokens (n of them, the first at position `pos`) that a
// sequence attends: with no tree mask (null) or before its new tokens all n as one; otherwise each
// stretch of consecutive tokens its mask row keeps. Writes run_first[k] (the offset from the first
// computed token) and run_n[k] for each stretch k and returns how many there are (at most n).
inline int attended_runs(const TreeMaskRow* tree, int pos, int n, int* run_first, int* run_n) {
  if (tree == nullptr || pos + n <= tree->first_new) {
    run_first[0] = 0;
    run_n[0] = n;
    return 1;
  }
  int runs = 0;
  for (int t = 0; t < n;) {
    if (!tree->attends(pos + t)) {
      ++t;
      continue;
    }
    int e = t + 1;
    while (e < n && tree->attends(pos + e)) ++e;
    run_first[runs] = t;
    run_n[runs++] = e - t;
    t = e;
  }
  return runs;
}

// The stretches of a block's computed tokens (n of them, the first at position `pos`) that a
// sequence's query tokens taken together under a tree mask (QueryBounds::tree) read: the tokens
// before its new ones as one, then each new token some query token keeps on its own, since the
// rows differ token by token there (BlockLogits::rows_n of 0 or 1). Written and returned as
// above; a new token no row keeps is never read.
inline int attended_runs(const QueryBounds& qb, int pos, int n, int* run_first, int* run_n) {
  int runs = 0;
  const int before = std::clamp(qb.first_query_pos - pos, 0, n);
  if (before > 0) {
    run_first[0] = 0;
    run_n[0] = before;
    runs = 1;
  }
  for (int t = before; t < n; ++t) {
    if (!qb.any_keeps(pos + t)) continue;
    run_first[runs] = t;
    run_n[runs++] = 1;
  }
  return runs;
}

// The most query heads per tile of the kernel: 16 on AMX (amx_tiles.hpp), 8 in registers.
constexpr int kHeadTile = 16;

// Floats between the score rows of two heads: block_size rounded up to a 64-byte multiple.
inline int scores_stride(int block_size) { return (block_size + 15) / 16 * 16; }

// Per-thread scratch: scores, then weights, for one block of one head tile.
struct ItemScratch {
  float* scores;       // kHeadTile * scores_stride(block_size) floats, 64-byte aligned
  float* q = nullptr;  // num_heads * head_dim floats: q in the kernel's widening order, or null
                       // (then the kernel widens bf16 the plain, slower way)
  // 2 * block_size * head_dim floats, a block's dequantized K rows then V rows, where the context
  // dequantizes (ItemContext::dequantizes); else null.
  float* rows = nullptr;
};

// Folds the blocks of `item` into the group's partial states: m[g], l[g], acc[g * head_dim + d]
// for the group_size query heads of the item's kv head (fresh states on entry).
struct ItemKernel {
  template <class Arch>
  void operator()(Arch, const ItemContext& ctx, const WorkItem& item, float* m, float* l,
                  float* acc, ItemScratch scratch) const;
  // The same for kv_count consecutive kv heads from item.kv_head over the item's blocks (the
  // plan's items of one (sequence, split)), block by block: m, l and acc hold kv_count *
  // group_size heads, in head order.
  template <class Arch>
  void operator()(Arch, const ItemContext& ctx, const WorkItem& item, int kv_count, float* m,
                  float* l, float* acc, ItemScratch scratch) const;
};

#if PAGEDATTN_CPU_X86
extern template void ItemKernel::operator()<xsimd::avx512bw>(xsimd::avx512bw, const ItemContext&,
                                                             const WorkItem&, float*, float*,
                                                             float*, ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::fma3<xsimd::avx2>>(xsimd::fma3<xsimd::avx2>,
                                                                      const ItemContext&,
                                                                      const WorkItem&, float*,
                                                                      float*, float*,
                                                                      ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::sse2>(xsimd::sse2, const ItemContext&,
                                                         const WorkItem&, float*, float*, float*,
                                                         ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::avx512bw>(xsimd::avx512bw, const ItemContext&,
                                                             const WorkItem&, int, float*, float*,
                                                             float*, ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::fma3<xsimd::avx2>>(xsimd::fma3<xsimd::avx2>,
                                                                      const ItemContext&,
                                                                      const WorkItem&, int, float*,
                                                                      float*, float*,
                                                                      ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::sse2>(xsimd::sse2, const ItemContext&,
                                                         const WorkItem&, int, float*, float*,
                                                         float*, ItemScratch) const;
#elif PAGEDATTN_CPU_ARM64
extern template void ItemKernel::operator()<xsimd::neon64>(xsimd::neon64, const ItemContext&,
                                                           const WorkItem&, float*, float*, float*,
                                                           ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::neon64>(xsimd::neon64, const ItemContext&,
                                                           const WorkItem&, int, float*, float*,
                                                           float*, ItemScratch) const;
#endif

#if PAGEDATTN_CPU_X86
// ItemKernel on AVX-512 with BF16 dot products (isa_avx512bf16.cpp): a bf16 cache with
// ctx.q_bf16 set takes Q.K as vdpbf16ps on the raw bf16 q and K; anything else runs the AVX-512
// kernel. Call it only where the CPU has AVX-512 BF16.
void item_kernel_avx512bf16(const ItemContext& ctx, const WorkItem& item, int kv_count, float* m,
                            float* l, float* acc, ItemScratch scratch);
#endif

#if PAGEDATTN_CPU_X86 && PAGEDATTN_CPU_AMX
// ItemKernel with Q.K on AMX tiles (isa_amx.cpp): a bf16 cache with ctx.q_bf16 set, a group that
// is a multiple of 8, a head dim that is a multiple of 32 and the q buffer take S^T = K Q^T as
// _tile_dpbf16ps; anything else runs the AVX-512 kernel. Call it only where the CPU has AMX-TILE,
// AMX-BF16 and AVX-512 BF16 and the operating system has granted the tile state.
void item_kernel_amx(const ItemContext& ctx, const WorkItem& item, int kv_count, float* m, float* l,
                     float* acc, ItemScratch scratch);
#endif

// One instruction set's task kernel: ItemKernel's kv_count form, item_kernel_avx512bf16 or
// item_kernel_amx.
using KernelFn = void (*)(const ItemContext&, const WorkItem&, int, float*, float*, float*,
                          ItemScratch);

// The kernel of the instruction set a PAGEDATTN_CPU_ISA value names, or null when this build has
// none of that name or the CPU cannot run it (for tests that run every path in one process).
KernelFn kernel_for_isa(const char* name);

// The name of the instruction set the dispatcher picks on this machine ("amx", "avx512bf16",
// "avx512", "avx2" or "sse2" on x86-64, "neon" on AArch64).
const char* active_isa_name();

}  // namespace pagedattn::detail::cpu
